//! The blobs table: a published blob's metadata; its bytes are a file in
//! the store's blob folder.

use std::path::{Path, PathBuf};

use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError};

/// A blob's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct BlobRow {
    /// Name.
    pub name: String,
    /// Size.
    pub size: u64,
    /// sha256 hex.
    pub sha256: String,
    /// Unix milliseconds.
    pub created_ms: i64,
}

impl Store {
    /// The folder of blob files.
    pub fn blob_dir(&self) -> &Path {
        &self.blobs
    }

    /// Where a blob's bytes live: a name-derived file name, so any blob name is safe.
    pub fn blob_path(&self, name: &str) -> PathBuf {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(name.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.blobs.join(hex)
    }

    /// Records a published blob (its file is already in place).
    pub fn put_blob(&self, b: &BlobRow) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "INSERT OR REPLACE INTO blobs(name, size, sha256, created_ms) VALUES (?1, ?2, ?3, ?4)",
                params![b.name, b.size as i64, b.sha256, b.created_ms],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// A blob's metadata.
    pub fn blob(&self, name: &str) -> Result<Option<BlobRow>, StoreError> {
        self.lock()
            .query_row("SELECT name, size, sha256, created_ms FROM blobs WHERE name = ?1", [name], |r| {
                Ok(BlobRow {
                    name: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    sha256: r.get(2)?,
                    created_ms: r.get(3)?,
                })
            })
            .optional()
            .map_err(self.sql())
    }

    /// Every blob.
    pub fn blobs(&self) -> Result<Vec<BlobRow>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("SELECT name, size, sha256, created_ms FROM blobs ORDER BY name")
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(BlobRow {
                    name: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    sha256: r.get(2)?,
                    created_ms: r.get(3)?,
                })
            })
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }
}
