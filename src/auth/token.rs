//! Auth tokens as etcd issues them (`--auth-token`): `simple` tokens, random strings this
//! process remembers for `--auth-token-ttl` seconds after their last use; or `jwt` tokens,
//! signed claims (`username`, `revision`, `exp`) that any instance holding the key can check.
//!
//! # Invariants
//! - A JWT token names the user and the auth revision it was issued at; a request is checked
//!   against that revision, so a JWT issued before a change to users or roles is refused as old
//!   and the client authenticates again. A simple token is a handle on its user, always at the
//!   current revision — etcd's rule.
//! - Simple tokens die with their user (deleted, or given a new password) and all at once when
//!   auth is disabled; JWT tokens cannot be recalled and live until they expire, as in etcd.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::Rng;
use rand::distr::Alphanumeric;

/// Who a token speaks for, and the auth revision it was issued at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthInfo {
    pub user: String,
    pub revision: i64,
}

/// `--auth-token`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenKind {
    Simple,
    Jwt {
        sign_method: String,
        pub_key: Option<String>,
        priv_key: Option<String>,
        ttl: Duration,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid --auth-token {0:?}: {1}")]
    Option(String, String),
    #[error("cannot read the JWT key {path}: {source}")]
    Key {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid JWT key {path}: {source}")]
    BadKey {
        path: String,
        source: jsonwebtoken::errors::Error,
    },
}

/// etcd's default lifetime of a JWT token.
const JWT_DEFAULT_TTL: Duration = Duration::from_secs(300);
/// How many simple tokens may pile up before expired ones are swept out.
const SWEEP_EVERY: usize = 1024;

impl TokenKind {
    /// Reads etcd's `--auth-token` value: `simple`, or `jwt,pub-key=PATH,priv-key=PATH,
    /// sign-method=RS256,ttl=5m`.
    ///
    /// # Errors
    /// An unknown kind, option or sign method, or a bad TTL.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Option(value.to_owned(), why.to_owned());
        let mut parts = value.split(',');
        match parts.next().unwrap_or_default() {
            "simple" => Ok(TokenKind::Simple),
            "jwt" => {
                let (mut sign_method, mut pub_key, mut priv_key, mut ttl) =
                    (None, None, None, JWT_DEFAULT_TTL);
                for option in parts {
                    let (name, setting) = option
                        .split_once('=')
                        .ok_or_else(|| bad("options are NAME=VALUE"))?;
                    match name {
                        "sign-method" => sign_method = Some(setting.to_owned()),
                        "pub-key" => pub_key = Some(setting.to_owned()),
                        "priv-key" => priv_key = Some(setting.to_owned()),
                        "ttl" => {
                            ttl = crate::config::parse_duration(setting).map_err(|e| bad(&e))?
                        }
                        other => return Err(bad(&format!("unknown option {other:?}"))),
                    }
                }
                let sign_method = sign_method.ok_or_else(|| bad("sign-method is required"))?;
                algorithm(&sign_method).ok_or_else(|| bad("unknown sign-method"))?;
                Ok(TokenKind::Jwt {
                    sign_method,
                    pub_key,
                    priv_key,
                    ttl,
                })
            }
            _ => Err(bad("expected simple or jwt,...")),
        }
    }
}

fn algorithm(sign_method: &str) -> Option<Algorithm> {
    Some(match sign_method {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// Issues and checks tokens.
pub enum Tokens {
    Simple {
        ttl: Duration,
        live: Mutex<HashMap<String, SimpleToken>>,
        /// Numbers the tokens, as etcd's raft index does (the random part makes them unique).
        issued: AtomicU64,
    },
    Jwt {
        algorithm: Algorithm,
        /// `None`: this instance only verifies (etcd allows a public key alone).
        encoding: Option<EncodingKey>,
        decoding: DecodingKey,
        ttl: Duration,
    },
}

pub struct SimpleToken {
    user: String,
    expires: Instant,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

impl Tokens {
    /// # Errors
    /// A JWT key file that cannot be read or parsed.
    pub fn new(kind: &TokenKind, simple_ttl: Duration) -> Result<Self, Error> {
        match kind {
            TokenKind::Simple => Ok(Tokens::Simple {
                ttl: simple_ttl,
                live: Mutex::new(HashMap::new()),
                issued: AtomicU64::new(0),
            }),
            TokenKind::Jwt {
                sign_method,
                pub_key,
                priv_key,
                ttl,
            } => {
                let algorithm = algorithm(sign_method).ok_or_else(|| {
                    Error::Option(sign_method.clone(), "unknown sign-method".into())
                })?;
                let read = |path: &String| {
                    std::fs::read(path).map_err(|source| Error::Key {
                        path: path.clone(),
                        source,
                    })
                };
                let bad = |path: &String| {
                    let path = path.clone();
                    move |source| Error::BadKey { path, source }
                };
                let (encoding, decoding) = if is_hmac(algorithm) {
                    // etcd takes the HMAC secret from priv-key.
                    let path = priv_key.as_ref().ok_or_else(|| {
                        Error::Option(sign_method.clone(), "priv-key is required".into())
                    })?;
                    let secret = read(path)?;
                    (
                        Some(EncodingKey::from_secret(&secret).map_err(bad(path))?),
                        DecodingKey::from_secret(&secret).map_err(bad(path))?,
                    )
                } else {
                    let path = pub_key.as_ref().ok_or_else(|| {
                        Error::Option(sign_method.clone(), "pub-key is required".into())
                    })?;
                    let public = read(path)?;
                    let decoding = match algorithm {
                        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&public),
                        Algorithm::EdDSA => DecodingKey::from_ed_pem(&public),
                        _ => DecodingKey::from_rsa_pem(&public),
                    }
                    .map_err(bad(path))?;
                    let encoding = match priv_key {
                        None => None,
                        Some(path) => {
                            let private = read(path)?;
                            Some(
                                match algorithm {
                                    Algorithm::ES256 | Algorithm::ES384 => {
                                        EncodingKey::from_ec_pem(&private)
                                    }
                                    Algorithm::EdDSA => EncodingKey::from_ed_pem(&private),
                                    _ => EncodingKey::from_rsa_pem(&private),
                                }
                                .map_err(bad(path))?,
                            )
                        }
                    };
                    (encoding, decoding)
                };
                Ok(Tokens::Jwt {
                    algorithm,
                    encoding,
                    decoding,
                    ttl: *ttl,
                })
            }
        }
    }

    /// A new token for `info`; `None` when this instance cannot sign (JWT with a public key only).
    pub fn assign(&self, info: AuthInfo) -> Option<String> {
        match self {
            Tokens::Simple { ttl, live, issued } => {
                let random: String = rand::rng()
                    .sample_iter(&Alphanumeric)
                    .filter(u8::is_ascii_alphabetic)
                    .take(16)
                    .map(char::from)
                    .collect();
                let mut live = lock(live);
                let now = Instant::now();
                if live.len() >= SWEEP_EVERY && live.len().is_power_of_two() {
                    live.retain(|_, t| t.expires > now);
                }
                let token = format!("{random}.{}", issued.fetch_add(1, Ordering::Relaxed) + 1);
                live.insert(
                    token.clone(),
                    SimpleToken {
                        user: info.user,
                        expires: now + *ttl,
                    },
                );
                Some(token)
            }
            Tokens::Jwt {
                algorithm,
                encoding,
                ttl,
                ..
            } => {
                let exp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
                    + ttl.as_secs();
                let claims = Claims {
                    username: info.user,
                    revision: u64::try_from(info.revision).unwrap_or(0),
                    exp,
                };
                jsonwebtoken::encode(&Header::new(*algorithm), &claims, encoding.as_ref()?).ok()
            }
        }
    }

    /// Who `token` speaks for, if it is valid; a simple token's lifetime starts again. A
    /// simple token stands for its user at the `current` auth revision (etcd's rule: only JWT
    /// tokens grow old when users or roles change).
    pub fn info(&self, token: &str, current: i64) -> Option<AuthInfo> {
        match self {
            Tokens::Simple { ttl, live, .. } => {
                let mut live = lock(live);
                let now = Instant::now();
                let found = live.get_mut(token)?;
                if found.expires <= now {
                    live.remove(token);
                    return None;
                }
                found.expires = now + *ttl;
                Some(AuthInfo {
                    user: found.user.clone(),
                    revision: current,
                })
            }
            Tokens::Jwt {
                algorithm,
                decoding,
                ..
            } => {
                let mut validation = Validation::new(*algorithm);
                validation.leeway = 0;
                validation.required_spec_claims = ["exp".to_owned()].into();
                let claims = jsonwebtoken::decode::<Claims>(token, decoding, &validation)
                    .ok()?
                    .claims;
                Some(AuthInfo {
                    user: claims.username,
                    revision: i64::try_from(claims.revision).ok()?,
                })
            }
        }
    }

    /// Forgets `user`'s simple tokens.
    pub fn invalidate_user(&self, user: &str) {
        if let Tokens::Simple { live, .. } = self {
            lock(live).retain(|_, t| t.user != user);
        }
    }

    /// Forgets every simple token (auth was disabled).
    pub fn clear(&self) {
        if let Tokens::Simple { live, .. } = self {
            lock(live).clear();
        }
    }
}

fn is_hmac(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update is one map operation: a panic cannot leave the map half-changed.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice(revision: i64) -> AuthInfo {
        AuthInfo {
            user: "alice".into(),
            revision,
        }
    }

    #[test]
    fn auth_token_flags_parse_as_etcd_writes_them() {
        assert_eq!(TokenKind::parse("simple").unwrap(), TokenKind::Simple);
        assert_eq!(
            TokenKind::parse("jwt,pub-key=a.pub,priv-key=a,sign-method=RS256,ttl=10m").unwrap(),
            TokenKind::Jwt {
                sign_method: "RS256".into(),
                pub_key: Some("a.pub".into()),
                priv_key: Some("a".into()),
                ttl: Duration::from_secs(600),
            }
        );
        for bad in [
            "",
            "opaque",
            "jwt",
            "jwt,sign-method=XX1",
            "jwt,sign-method=RS256,ttl=x",
            "jwt,sign-method=RS256,colour=red",
        ] {
            assert!(TokenKind::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn simple_tokens_name_their_user_until_invalidated() {
        let tokens = Tokens::new(&TokenKind::Simple, Duration::from_secs(300)).unwrap();
        let token = tokens.assign(alice(3)).unwrap();
        let (random, index) = token.split_once('.').unwrap();
        assert_eq!(random.len(), 16);
        assert!(random.bytes().all(|b| b.is_ascii_alphabetic()));
        assert!(index.parse::<u64>().is_ok());
        // A simple token follows the current auth revision.
        assert_eq!(tokens.info(&token, 5), Some(alice(5)));
        assert_eq!(tokens.info("nonsense.1", 5), None);
        tokens.invalidate_user("alice");
        assert_eq!(tokens.info(&token, 5), None);
        let token = tokens.assign(alice(4)).unwrap();
        tokens.clear();
        assert_eq!(tokens.info(&token, 5), None);
    }

    #[test]
    fn simple_tokens_expire_after_their_ttl() {
        let tokens = Tokens::new(&TokenKind::Simple, Duration::ZERO).unwrap();
        let token = tokens.assign(alice(1)).unwrap();
        assert_eq!(tokens.info(&token, 1), None);
    }

    #[test]
    fn jwt_tokens_carry_user_and_revision_and_are_checked_by_signature() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"a shared secret of enough length").unwrap();
        let kind = |ttl: &str| {
            TokenKind::parse(&format!(
                "jwt,priv-key={},sign-method=HS256,ttl={ttl}",
                secret.display()
            ))
            .unwrap()
        };
        let tokens = Tokens::new(&kind("5m"), Duration::ZERO).unwrap();
        let token = tokens.assign(alice(7)).unwrap();
        // A JWT keeps the revision it was issued at.
        assert_eq!(tokens.info(&token, 9), Some(alice(7)));
        // Another instance with the same key accepts it.
        let other = Tokens::new(&kind("5m"), Duration::ZERO).unwrap();
        assert_eq!(other.info(&token, 9), Some(alice(7)));
        let mut forged = token.clone();
        forged.pop();
        assert_eq!(tokens.info(&forged, 9), None);
        let TokenKind::Jwt {
            sign_method,
            priv_key,
            ..
        } = kind("5m")
        else {
            unreachable!("a jwt kind")
        };
        let zero = TokenKind::Jwt {
            sign_method,
            pub_key: None,
            priv_key,
            ttl: Duration::ZERO,
        };
        let expired = Tokens::new(&zero, Duration::ZERO).unwrap();
        let token = expired.assign(alice(7)).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(expired.info(&token, 7), None);
    }
}
