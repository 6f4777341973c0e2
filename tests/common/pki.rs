//! Test certificates: a CA and what it signed, generated with rcgen into a temporary folder at
//! test time (nothing is committed).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A CA and what it signed, as PEM files in a temporary folder (the layout kubeadm uses for
/// etcd: a CA, a server certificate, an API server client certificate).
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA "etcd-ca" with a server certificate for localhost/127.0.0.1/::1 and a client
    /// certificate; and a second, unrelated CA with a client certificate of its own.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let etcd_ca = ca("etcd-ca");
        write_leaf(
            dir.path(),
            "server",
            &etcd_ca,
            "etcdsql",
            &["localhost", "127.0.0.1", "::1"],
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        write_leaf(
            dir.path(),
            "client",
            &etcd_ca,
            "kube-apiserver-etcd-client",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        std::fs::write(dir.path().join("ca.crt"), etcd_ca.pem()).unwrap();
        let other = ca("someone-else");
        write_leaf(
            dir.path(),
            "stranger",
            &other,
            "kube-apiserver-etcd-client",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        std::fs::write(dir.path().join("other-ca.crt"), other.pem()).unwrap();
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn write_leaf(
    dir: &Path,
    name: &str,
    ca: &CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    sans: &[&str],
    usages: &[ExtendedKeyUsagePurpose],
) {
    let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
    let mut params = CertificateParams::new(sans).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = usages.to_vec();
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}
