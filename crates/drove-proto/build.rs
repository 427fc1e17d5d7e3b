//! Generates the drove.v1 client and server code from this crate's `proto/`
//! (the repository's `proto` links here, so the packaged crate carries them), with protoc from
//! the `protoc-bin-vendored` crate (no system package needed), and a file
//! descriptor set for gRPC reflection.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let root = root.canonicalize().map_err(|e| format!("{}: {e}", root.display()))?;
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let files: Vec<PathBuf> = ["rendezvous", "weights", "metrics"]
        .iter()
        .map(|f| root.join(format!("drove/v1/{f}.proto")))
        .collect();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    // Blob bytes as `bytes::Bytes`: decoded without a copy, sliced from the frame.
    tonic_prost_build::configure()
        .bytes(".drove.v1.PublishChunk.data")
        .bytes(".drove.v1.FetchChunk.data")
        .file_descriptor_set_path(out.join("drove_v1_descriptor.bin"))
        .compile_protos(&files, &[root])?;
    Ok(())
}
