//! The greeting a rank sends on each connection of the mesh (who it is, in
//! which world and generation, on which host), and the socket settings every
//! connection gets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use crate::host_id::MAX_HOST_ID;

/// The greeting's first word: drove's mesh protocol and its version.
pub(crate) const MAGIC: u64 = 0x6472_6f76_6532_0002; // "drove2" + protocol version 2 (the greeting carries the generation)

/// Every connection's settings: no Nagle, 4 MiB socket buffers where allowed.
pub(crate) fn tune(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = socket2::SockRef::from(stream);
    let _ = sock.set_send_buffer_size(4 << 20);
    let _ = sock.set_recv_buffer_size(4 << 20);
    Ok(())
}

/// What a rank says when it connects: who it is, in which world.
pub(crate) struct Hello {
    pub magic: u64,
    pub generation: u64,
    pub rank: usize,
    pub world: usize,
    pub host: String,
}

/// Sends this rank's greeting.
pub(crate) fn write_hello(
    stream: &mut TcpStream,
    generation: u64,
    rank: usize,
    world: usize,
    host: &str,
) -> std::io::Result<()> {
    let host = host.as_bytes(); // at most MAX_HOST_ID bytes (`host_id` cuts it)
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&(rank as u32).to_le_bytes());
    b.extend_from_slice(&(world as u32).to_le_bytes());
    b.extend_from_slice(&(host.len() as u32).to_le_bytes());
    b.extend_from_slice(host);
    stream.write_all(&b)
}

/// Reads a peer's greeting (a host id over the limit is an error).
pub(crate) fn read_hello(stream: &mut TcpStream) -> std::io::Result<Hello> {
    let mut head = [0u8; 28];
    stream.read_exact(&mut head)?;
    let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes")) as usize;
    let magic = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let generation = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
    let (rank, world, len) = (word(16), word(20), word(24));
    if len > MAX_HOST_ID {
        return Err(std::io::Error::other(format!("a host id of {len} bytes (at most {MAX_HOST_ID})")));
    }
    let mut host = vec![0u8; len];
    stream.read_exact(&mut host)?;
    Ok(Hello { magic, generation, rank, world, host: String::from_utf8_lossy(&host).into_owned() })
}

/// The greeting of an accepted connection, if it is one of the `missing`
/// ranks of this world and generation; anything else is logged and ignored.
pub(crate) fn expected_hello(
    stream: &mut TcpStream,
    from: SocketAddr,
    generation: u64,
    world: usize,
    missing: &[usize],
) -> Option<Hello> {
    let Ok(hello) = read_hello(stream) else {
        tracing::warn!(%from, "ignoring a connection that sent no valid greeting");
        return None;
    };
    if hello.generation != generation {
        tracing::warn!(
            %from,
            theirs = hello.generation,
            ours = generation,
            "refusing a connection from another generation of the run (a rank left out of it?)"
        );
        return None;
    }
    if hello.magic != MAGIC || hello.world != world || !missing.contains(&hello.rank) {
        tracing::warn!(%from, their_rank = hello.rank, their_world = hello.world, "ignoring an unexpected connection");
        return None;
    }
    Some(hello)
}
