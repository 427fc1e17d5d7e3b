//! The Weights service: blobs published in chunks with a sha256, stored as files,
//! streamed to any number of fetchers. A blob is visible only once complete and
//! verified; a failed publish leaves nothing behind.

use std::io::Write;
use std::pin::Pin;

use drove_proto::v1::weights_server::Weights;
use drove_proto::v1::{
    BlobHeader, BlobInfo, FetchChunk, FetchRequest, ListBlobsRequest, ListBlobsResponse, PublishChunk,
};
use futures::Stream;
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::store::{BlobRow, Store, now_ms};
use crate::validate::internal;

/// Shared weights state.
#[derive(Clone)]
pub struct WeightsService {
    store: Store,
    max_chunk: usize,
}

impl WeightsService {
    /// Blobs in `store`; chunks larger than `max_chunk` bytes are refused.
    pub fn new(store: Store, max_chunk: usize) -> Self {
        WeightsService { store, max_chunk }
    }
}

fn check_name(name: &str) -> Result<(), Status> {
    if name.is_empty() || name.len() > 256 {
        return Err(Status::invalid_argument(format!(
            "header.name must be 1 to 256 characters, found {}",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || "._/-".contains(*c))) {
        return Err(Status::invalid_argument(format!(
            "header.name {name:?} contains {c:?}; allowed: A-Z a-z 0-9 . _ / -"
        )));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn info(b: &BlobRow) -> BlobInfo {
    BlobInfo { name: b.name.clone(), size: b.size, sha256: b.sha256.clone(), created_unix_ms: b.created_ms }
}

/// A temporary file removed on drop unless kept.
struct Partial {
    path: std::path::PathBuf,
    keep: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Partial {
    /// A new temporary file in the blob folder, named after `final_path` (and
    /// a nonce, so that concurrent publishes of one name do not meet).
    fn create(store: &Store, final_path: &std::path::Path) -> Result<(Partial, std::fs::File), Status> {
        let nonce = now_ms() ^ (std::process::id() as i64) << 20 ^ rand_suffix();
        let partial = Partial {
            path: store.blob_dir().join(format!(
                ".partial-{}-{nonce:x}",
                final_path.file_name().unwrap_or_default().to_string_lossy()
            )),
            keep: false,
        };
        let file = std::fs::File::create(&partial.path).map_err(internal)?;
        Ok((partial, file))
    }
}

/// Checks a publish header's name and sha256; returns the sha256 in lower case.
fn check_header(header: &BlobHeader) -> Result<String, Status> {
    check_name(&header.name)?;
    let want_sha = header.sha256.to_ascii_lowercase();
    if want_sha.len() != 64 || !want_sha.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Status::invalid_argument(format!(
            "header.sha256 must be 64 hex digits, found {:?}",
            header.sha256
        )));
    }
    Ok(want_sha)
}

impl WeightsService {
    /// Writes the chunks of a publish (`first`, then the rest of `stream`) to
    /// `file` while hashing them, each checked against the chunk limit and the
    /// declared `size`; returns the bytes written and their sha256 in hex.
    async fn receive(
        &self,
        first: PublishChunk,
        stream: &mut Streaming<PublishChunk>,
        size: u64,
        file: &mut std::fs::File,
    ) -> Result<(u64, String), Status> {
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        let mut chunk = Some(first);
        let mut index = 0usize;
        loop {
            let c = match chunk.take() {
                Some(c) => c,
                None => match stream.next().await {
                    Some(c) => c?,
                    None => break,
                },
            };
            self.check_chunk(index, &c, written, size)?;
            hasher.update(&c.data);
            file.write_all(&c.data).map_err(internal)?;
            written += c.data.len() as u64;
            index += 1;
        }
        Ok((written, hex(&hasher.finalize())))
    }

    /// Chunk `index` of a publish of `size` bytes, `written` of them so far:
    /// no header after the first, within the chunk limit, not past `size`.
    fn check_chunk(&self, index: usize, c: &PublishChunk, written: u64, size: u64) -> Result<(), Status> {
        if index > 0 && c.header.is_some() {
            return Err(Status::invalid_argument(format!(
                "chunk {index} carries a header; only the first may"
            )));
        }
        if c.data.len() > self.max_chunk {
            return Err(Status::invalid_argument(format!(
                "chunk {index}: data of {} bytes exceeds the chunk limit of {} bytes",
                c.data.len(),
                self.max_chunk
            )));
        }
        if written + c.data.len() as u64 > size {
            return Err(Status::invalid_argument(format!(
                "chunk {index} goes past the declared header.size of {size} bytes (reaches {})",
                written + c.data.len() as u64
            )));
        }
        Ok(())
    }
}

type FetchStream = Pin<Box<dyn Stream<Item = Result<FetchChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Weights for WeightsService {
    async fn publish(&self, request: Request<Streaming<PublishChunk>>) -> Result<Response<BlobInfo>, Status> {
        let mut stream = request.into_inner();
        let first = stream.next().await.ok_or_else(|| {
            Status::invalid_argument("the stream carried no chunk; the first must hold the header")
        })??;
        let header = first
            .header
            .clone()
            .ok_or_else(|| Status::invalid_argument("the first chunk must carry header"))?;
        let want_sha = check_header(&header)?;
        let final_path = self.store.blob_path(&header.name);
        let (mut partial, mut file) = Partial::create(&self.store, &final_path)?;
        let (written, got_sha) = self.receive(first, &mut stream, header.size, &mut file).await?;
        if written != header.size {
            return Err(Status::invalid_argument(format!(
                "the stream ended after {written} bytes, but header.size declared {}",
                header.size
            )));
        }
        if got_sha != want_sha {
            return Err(Status::invalid_argument(format!(
                "header.sha256 is {want_sha} but the bytes received hash to {got_sha}"
            )));
        }
        file.sync_all().map_err(internal)?;
        drop(file);
        std::fs::rename(&partial.path, &final_path).map_err(internal)?;
        partial.keep = true;
        let row = BlobRow { name: header.name.clone(), size: written, sha256: got_sha, created_ms: now_ms() };
        self.store.put_blob(&row).map_err(internal)?;
        tracing::info!(name = %row.name, size = row.size, "blob published");
        Ok(Response::new(info(&row)))
    }

    type FetchStream = FetchStream;

    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<Self::FetchStream>, Status> {
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name must not be empty"));
        }
        let row = self
            .store
            .blob(&req.name)
            .map_err(internal)?
            .ok_or_else(|| Status::not_found(format!("no blob named {:?}", req.name)))?;
        let chunk = match req.chunk_bytes as usize {
            0 => 1 << 20,
            n => n,
        }
        .min(self.max_chunk);
        let path = self.store.blob_path(&row.name);
        let file = std::fs::File::open(&path).map_err(internal)?;
        // Chunks are slices of a read-only map of the file: no copy on this side
        // before the encoder's. Published files are never modified in place (a new
        // version is renamed over the name), so the map stays valid.
        let whole = if row.size == 0 {
            prost::bytes::Bytes::new()
        } else {
            // SAFETY: the file is immutable once published (see above).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(internal)?;
            if map.len() as u64 != row.size {
                return Err(Status::data_loss(format!(
                    "blob {:?} is {} bytes on disk but {} in the store",
                    row.name,
                    map.len(),
                    row.size
                )));
            }
            prost::bytes::Bytes::from_owner(map)
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<FetchChunk, Status>>(4);
        tokio::spawn(async move {
            let mut first = Some(info(&row));
            let mut offset = 0usize;
            loop {
                let end = (offset + chunk).min(whole.len());
                let data = whole.slice(offset..end);
                offset = end;
                if tx.send(Ok(FetchChunk { info: first.take(), data })).await.is_err()
                    || offset == whole.len()
                {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn list(&self, _request: Request<ListBlobsRequest>) -> Result<Response<ListBlobsResponse>, Status> {
        let blobs = self.store.blobs().map_err(internal)?.iter().map(info).collect();
        Ok(Response::new(ListBlobsResponse { blobs }))
    }
}

fn rand_suffix() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish() as i64
}
