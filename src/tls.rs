//! TLS for the client listeners: the server certificate, client-certificate authentication,
//! and the protocol versions, built once at start-up from etcd's flags.
//!
//! # Policy
//! - `--cert-file` and `--key-file` go together; either alone is a start-up error.
//! - Client certificates are **required and verified** against `--trusted-ca-file` whenever
//!   that file is given or `--client-cert-auth` is set, as etcd does
//!   (`transport.TLSInfo.ServerConfig`). A client without a certificate, or with one that CA
//!   did not sign, fails the handshake: it never reaches a gRPC or HTTP handler. etcd would
//!   verify `--client-cert-auth` without a CA file against the system roots; etcdsql refuses
//!   to start instead, because "any certificate any public CA ever issued" is never what an
//!   operator meant.
//! - TLS 1.2 and 1.3 only (`--tls-min-version` may raise the floor to 1.3); rustls has no
//!   older versions and no weak cipher suites to turn off.
//! - ALPN offers `h2` (gRPC clients such as grpc-go insist on it) and `http/1.1` (curl,
//!   kubeadm's `/version` check). The server also detects the protocol from the first bytes,
//!   so a client that negotiates nothing works too.
//! - The crypto provider is chosen explicitly (ring), so the process never depends on which
//!   rustls provider other crates happen to enable.
//!
//! Every error names the file it is about, so a bad path or a PEM file of the wrong kind is
//! obvious from the start-up message alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{
    self, RootCertStore, ServerConfig, SupportedProtocolVersion, server::WebPkiClientVerifier,
};

/// The lowest TLS version the listeners accept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MinVersion {
    #[default]
    #[value(name = "TLS1.2")]
    Tls12,
    #[value(name = "TLS1.3")]
    Tls13,
}

/// The TLS flags, as given on the command line.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub trusted_ca_file: Option<PathBuf>,
    pub client_cert_auth: bool,
    pub min_version: MinVersion,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--cert-file is set but --key-file is not: TLS needs both")]
    MissingKey,
    #[error("--key-file is set but --cert-file is not: TLS needs both")]
    MissingCert,
    #[error(
        "--client-cert-auth needs --trusted-ca-file: the CA that signs the client certificates"
    )]
    MissingCa,
    #[error("--trusted-ca-file/--client-cert-auth need --cert-file and --key-file")]
    ClientAuthWithoutTls,
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path} holds no PEM {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{what} {path} is not valid PEM: {source}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("trusted CA file {path}: a certificate cannot be used as a trust anchor: {source}")]
    BadCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error(
        "key file {key} does not match certificate file {cert}, or is not a usable key: {source}"
    )]
    KeyPair {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("cannot set up client certificate verification with {path}: {source}")]
    Verifier {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
    #[error("cannot set up TLS: {0}")]
    Config(#[from] rustls::Error),
}

impl Settings {
    pub fn from_config(config: &crate::Config) -> Self {
        Self {
            cert_file: config.cert_file.clone(),
            key_file: config.key_file.clone(),
            trusted_ca_file: config.trusted_ca_file.clone(),
            client_cert_auth: config.client_cert_auth,
            min_version: config.tls_min_version,
        }
    }

    /// True if the flags turn TLS on (a certificate or key was given).
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }

    /// True if clients must present a certificate signed by the trusted CA.
    pub fn requires_client_certs(&self) -> bool {
        self.client_cert_auth || self.trusted_ca_file.is_some()
    }

    /// The rustls server configuration, or `None` when TLS is off.
    ///
    /// # Errors
    /// Inconsistent flags, or a certificate, key or CA file that cannot be read or used; the
    /// message names the file.
    pub fn server_config(&self) -> Result<Option<Arc<ServerConfig>>, Error> {
        let (cert_file, key_file) = match (&self.cert_file, &self.key_file) {
            (None, None) => {
                return if self.requires_client_certs() {
                    Err(Error::ClientAuthWithoutTls)
                } else {
                    Ok(None)
                };
            }
            (Some(_), None) => return Err(Error::MissingKey),
            (None, Some(_)) => return Err(Error::MissingCert),
            (Some(cert), Some(key)) => (cert, key),
        };
        if self.client_cert_auth && self.trusted_ca_file.is_none() {
            return Err(Error::MissingCa);
        }
        let certs = read_certs("certificate file", cert_file)?;
        let key = read_key(key_file)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        static TLS12_AND_13: &[&SupportedProtocolVersion] =
            &[&rustls::version::TLS13, &rustls::version::TLS12];
        static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let versions = match self.min_version {
            MinVersion::Tls12 => TLS12_AND_13,
            MinVersion::Tls13 => TLS13_ONLY,
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)?;
        let builder = match &self.trusted_ca_file {
            Some(ca_file) => {
                let mut roots = RootCertStore::empty();
                for ca in read_certs("trusted CA file", ca_file)? {
                    roots.add(ca).map_err(|source| Error::BadCa {
                        path: ca_file.clone(),
                        source,
                    })?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|source| Error::Verifier {
                        path: ca_file.clone(),
                        source,
                    })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|source| Error::KeyPair {
                cert: cert_file.clone(),
                key: key_file.clone(),
                source,
            })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Some(Arc::new(config)))
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Pem {
            what,
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(Error::Empty {
            what,
            path: path.to_owned(),
            expected: "CERTIFICATE block",
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file: PKCS#8, PKCS#1 (RSA) or SEC1 (EC), as openssl and
/// kubeadm write them.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    const WHAT: &str = "key file";
    let pem = read(WHAT, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| match source {
        rustls_pki_types::pem::Error::NoItemsFound => Error::Empty {
            what: WHAT,
            path: path.to_owned(),
            expected: "PRIVATE KEY block",
        },
        source => Error::Pem {
            what: WHAT,
            path: path.to_owned(),
            source,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cert: Option<&str>, key: Option<&str>) -> Settings {
        Settings {
            cert_file: cert.map(PathBuf::from),
            key_file: key.map(PathBuf::from),
            ..Settings::default()
        }
    }

    #[test]
    fn off_without_files() {
        assert!(settings(None, None).server_config().unwrap().is_none());
    }

    #[test]
    fn flags_must_come_in_pairs() {
        assert!(matches!(
            settings(Some("c.pem"), None).server_config(),
            Err(Error::MissingKey)
        ));
        assert!(matches!(
            settings(None, Some("k.pem")).server_config(),
            Err(Error::MissingCert)
        ));
        let mut ca_only = settings(None, None);
        ca_only.trusted_ca_file = Some("ca.pem".into());
        assert!(matches!(
            ca_only.server_config(),
            Err(Error::ClientAuthWithoutTls)
        ));
        let mut no_ca = settings(Some("c.pem"), Some("k.pem"));
        no_ca.client_cert_auth = true;
        assert!(matches!(no_ca.server_config(), Err(Error::MissingCa)));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = settings(missing.to_str(), Some("k.pem"))
            .server_config()
            .unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");

        let not_pem = dir.path().join("notes.txt");
        std::fs::write(&not_pem, "hello").unwrap();
        let err = settings(not_pem.to_str(), Some("k.pem"))
            .server_config()
            .unwrap_err();
        assert!(matches!(err, Error::Empty { .. }), "{err}");
        assert!(err.to_string().contains("notes.txt"), "{err}");
    }
}
