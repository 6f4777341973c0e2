//! Snapshots (Maintenance.Snapshot, `etcdsql backup`) and restoring them (`etcdsql restore`).
//!
//! # Format
//! A snapshot is a SQLite database holding the whole store in etcdsql's own schema (see
//! `backend/backup.rs`), followed by the SHA-256 of those bytes — the same trailer etcd appends
//! to its snapshots, so a file's size modulo 512 is 32 (SQLite, like bbolt, writes whole
//! pages). A restore refuses a file whose checksum does not match.
//!
//! # Invariants
//! - A snapshot is one consistent state of the store, taken while it serves.
//! - A restore goes into an empty store only, all at once; the file is checked first.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::backend::{self, Backend};

/// Bytes of the checksum at the end of a snapshot.
pub const CHECKSUM_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Backend(#[from] backend::Error),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}: not a snapshot (too short to hold a database and its checksum)")]
    TooShort(String),
    #[error("{0}: the checksum does not match the contents; the snapshot is damaged")]
    Checksum(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A consistent copy of the store as a SQLite file (without checksum) in a new temporary
/// folder, which goes away with the returned guard.
///
/// # Errors
/// The database cannot be read, or the temporary folder cannot be written.
pub async fn take(backend: &Arc<dyn Backend>) -> Result<(tempfile::TempDir, PathBuf), Error> {
    let dir = tempfile::Builder::new()
        .prefix("etcdsql-snapshot")
        .tempdir()
        .map_err(io(Path::new("a temporary folder")))?;
    let path = dir.path().join("snapshot.db");
    backend.backup(&path).await?;
    Ok((dir, path))
}

/// The SHA-256 of a file.
///
/// # Errors
/// The file cannot be read.
pub fn checksum(path: &Path) -> Result<[u8; CHECKSUM_BYTES], Error> {
    let mut file = std::fs::File::open(path).map_err(io(path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io(path))?;
    Ok(hasher.finalize().into())
}

/// Writes a snapshot of the store to `dest`: the database, then its checksum.
///
/// # Errors
/// The database cannot be read or `dest` cannot be written.
pub async fn save(backend: &Arc<dyn Backend>, dest: &Path) -> Result<u64, Error> {
    let (_dir, database) = take(backend).await?;
    let sum = checksum(&database)?;
    std::fs::copy(&database, dest).map_err(io(dest))?;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(dest)
        .map_err(io(dest))?;
    file.write_all(&sum).map_err(io(dest))?;
    file.sync_all().map_err(io(dest))?;
    Ok(file.metadata().map_err(io(dest))?.len())
}

/// Checks a snapshot's checksum and copies its database part into `dir`.
///
/// # Errors
/// The file cannot be read, is too short, or its checksum does not match.
pub fn unpack(snapshot: &Path, dir: &Path) -> Result<PathBuf, Error> {
    let bytes = std::fs::read(snapshot).map_err(io(snapshot))?;
    let name = snapshot.display().to_string();
    if bytes.len() <= CHECKSUM_BYTES {
        return Err(Error::TooShort(name));
    }
    let (database, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if Sha256::digest(database)[..] != *sum {
        return Err(Error::Checksum(name));
    }
    let path = dir.join("restore.db");
    std::fs::write(&path, database).map_err(io(&path))?;
    Ok(path)
}

/// Restores `snapshot` into the empty store at `backend`.
///
/// # Errors
/// The snapshot is damaged, the store is not empty, or a database fails.
pub async fn restore(backend: &Arc<dyn Backend>, snapshot: &Path) -> Result<(), Error> {
    let dir = tempfile::Builder::new()
        .prefix("etcdsql-restore")
        .tempdir()
        .map_err(io(Path::new("a temporary folder")))?;
    let database = unpack(snapshot, dir.path())?;
    backend.restore(&database, &|_| {}).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_snapshot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        let mut content = b"SQLite format 3\0 and some pages".to_vec();
        let sum: [u8; 32] = Sha256::digest(&content).into();
        content.extend_from_slice(&sum);
        std::fs::write(&good, &content).unwrap();
        let unpacked = unpack(&good, dir.path()).unwrap();
        assert_eq!(
            std::fs::read(unpacked).unwrap(),
            b"SQLite format 3\0 and some pages"
        );
        content[3] ^= 1;
        let bad = dir.path().join("bad");
        std::fs::write(&bad, &content).unwrap();
        assert!(matches!(unpack(&bad, dir.path()), Err(Error::Checksum(_))));
        let short = dir.path().join("short");
        std::fs::write(&short, [0u8; 10]).unwrap();
        assert!(matches!(
            unpack(&short, dir.path()),
            Err(Error::TooShort(_))
        ));
    }
}
