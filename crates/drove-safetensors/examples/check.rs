//! Checks the header of each safetensors file named on the command line:
//! `cargo run -p drove-safetensors --example check -- assets/minilm/model.safetensors`.
//! With no argument, it checks a small file it builds and a cut copy of it.

use std::process::ExitCode;

fn main() -> ExitCode {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    let demo = paths.is_empty();
    let files: Vec<(String, Vec<u8>)> = if paths.is_empty() {
        let header = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        let mut whole = (header.len() as u64).to_le_bytes().to_vec();
        whole.extend_from_slice(header);
        whole.extend_from_slice(&[0u8; 16]);
        let cut = whole[..whole.len() - 6].to_vec();
        vec![("built".into(), whole), ("built, cut short".into(), cut)]
    } else {
        let mut files = Vec::new();
        for p in paths {
            match std::fs::read(&p) {
                Ok(bytes) => files.push((p, bytes)),
                Err(e) => {
                    eprintln!("{p}: cannot read: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        files
    };
    let mut verdicts = Vec::new();
    for (name, bytes) in files {
        let verdict = drove_safetensors::check_header(&bytes);
        match &verdict {
            Ok(()) => println!("{name}: a well-formed header over {} bytes", bytes.len()),
            Err(e) => println!("{name}: {e}"),
        }
        verdicts.push(verdict.is_ok());
    }
    // The demonstration passes when the whole file is accepted and the cut one is not.
    let expected = if demo { vec![true, false] } else { vec![true; verdicts.len()] };
    if verdicts == expected { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
