//! A full mesh of TCP connections between the ranks, non-blocking, with one
//! waiting primitive that watches every peer for hang-ups while it waits for the
//! ones it needs, so a dead rank is named as soon as the kernel notices, and a
//! silent one when the deadline passes.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::greeting::{MAGIC, expected_hello, read_hello, tune, write_hello};
use crate::profile::ExchangeTimes;
use drove_collective::CommError;

/// How long ranks waited for get to hang up after another peer did, so that
/// the rank that died first is named even when it is noticed second.
const HANG_UP_GRACE: Duration = Duration::from_millis(500);

/// Connections to every other rank.
pub(crate) struct Mesh {
    pub rank: usize,
    pub world: usize,
    peers: Vec<Option<TcpStream>>,
    /// Host id of each rank (`hosts::host_id`): equal ids share a host.
    pub host_ids: Vec<String>,
    /// While the ring is profiled: what the current exchange measured.
    pub timing: Option<ExchangeTimes>,
}

impl Mesh {
    /// Connects to every peer of world `generation` (0 for a fixed world; an
    /// elastic run's worlds count from 1): rank `i` dials every lower rank and
    /// accepts every higher one. A peer of another generation is refused (a
    /// rank left out of an elastic run, resumed after its world re-formed).
    /// Everything happens before `deadline`.
    pub fn connect(
        generation: u64,
        rank: usize,
        world: usize,
        listener: &TcpListener,
        addrs: &[SocketAddr],
        host: &str,
        deadline: Instant,
    ) -> Result<Mesh, CommError> {
        let host = host.to_string();
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        let mut host_ids = vec![String::new(); world];
        host_ids[rank] = host.clone();
        let timeout_err = |what: String| CommError::Rendezvous(format!("rank {rank}: {what}"));
        // Dial lower ranks, retrying until they listen.
        for (peer, addr) in addrs.iter().enumerate().take(rank) {
            let mut backoff = Duration::from_millis(5);
            let mut stream = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(timeout_err(format!("could not connect to rank {peer} at {addr} in time")));
                }
                match TcpStream::connect_timeout(addr, left.min(Duration::from_secs(2))) {
                    Ok(s) => break s,
                    Err(e) if matches!(e.kind(), ErrorKind::ConnectionRefused | ErrorKind::TimedOut) => {
                        // The peer is not listening yet: back off, bounded by the deadline.
                        std::thread::sleep(backoff.min(left));
                        backoff = (backoff * 2).min(Duration::from_millis(200));
                    }
                    Err(e) => return Err(CommError::io(format!("connecting to rank {peer} at {addr}"), e)),
                }
            };
            tune(&stream).map_err(|e| CommError::io("configuring a socket", e))?;
            stream
                .set_read_timeout(Some(
                    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
                ))
                .map_err(|e| CommError::io("configuring a socket", e))?;
            write_hello(&mut stream, generation, rank, world, &host)
                .map_err(|e| CommError::io(format!("greeting rank {peer}"), e))?;
            let hello = read_hello(&mut stream)
                .map_err(|e| CommError::io(format!("reading rank {peer}'s greeting"), e))?;
            if hello.magic != MAGIC || hello.rank != peer || hello.world != world {
                return Err(timeout_err(format!(
                    "{addr} answered as rank {} of {} (protocol {:#x}), expected rank {peer} of {world}",
                    hello.rank, hello.world, hello.magic
                )));
            }
            if hello.generation != generation {
                return Err(CommError::StaleGeneration { ours: generation, theirs: hello.generation, peer });
            }
            host_ids[peer] = hello.host;
            peers[peer] = Some(stream);
        }
        // Accept higher ranks.
        listener.set_nonblocking(true).map_err(|e| CommError::io("configuring the listener", e))?;
        let mut missing: Vec<usize> = (rank + 1..world).collect();
        while !missing.is_empty() {
            match listener.accept() {
                Ok((mut stream, from)) => {
                    stream.set_nonblocking(false).map_err(|e| CommError::io("configuring a socket", e))?;
                    tune(&stream).map_err(|e| CommError::io("configuring a socket", e))?;
                    stream
                        .set_read_timeout(Some(
                            deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
                        ))
                        .map_err(|e| CommError::io("configuring a socket", e))?;
                    let Some(hello) = expected_hello(&mut stream, from, generation, world, &missing) else {
                        continue;
                    };
                    let their_rank = hello.rank;
                    write_hello(&mut stream, generation, rank, world, &host)
                        .map_err(|e| CommError::io(format!("greeting rank {their_rank}"), e))?;
                    missing.retain(|&r| r != their_rank);
                    host_ids[their_rank] = hello.host;
                    peers[their_rank] = Some(stream);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(timeout_err(format!("rank(s) {missing:?} never connected")));
                    }
                    poll_one(listener.as_raw_fd(), libc::POLLIN, left.min(Duration::from_millis(100)));
                }
                Err(e) => return Err(CommError::io("accepting a connection", e)),
            }
        }
        for s in peers.iter().flatten() {
            s.set_read_timeout(None).map_err(|e| CommError::io("configuring a socket", e))?;
            s.set_nonblocking(true).map_err(|e| CommError::io("configuring a socket", e))?;
        }
        Ok(Mesh { rank, world, peers, host_ids, timing: None })
    }

    fn stream(&mut self, peer: usize) -> &mut TcpStream {
        self.peers[peer].as_mut().expect("a connection to every other rank")
    }

    /// Waits until one of `want` (peer, POLLIN/POLLOUT) is ready, watching all
    /// peers for hang-ups. Errors name dead peers, or the awaited ones on timeout.
    pub fn wait(&self, want: &[(usize, i16)], clock: &mut Clock) -> Result<(), CommError> {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.world);
        let mut who: Vec<usize> = Vec::with_capacity(self.world);
        for (peer, s) in self.peers.iter().enumerate() {
            let Some(s) = s else { continue };
            let mut events = libc::POLLRDHUP;
            for &(p, e) in want {
                if p == peer {
                    events |= e;
                }
            }
            fds.push(libc::pollfd { fd: s.as_raw_fd(), events, revents: 0 });
            who.push(peer);
        }
        let waiting: Vec<usize> = want.iter().map(|&(p, _)| p).collect();
        loop {
            self.check_deadline(clock, &waiting)?;
            let ms = clock.slice().as_millis().clamp(1, 1000) as i32;
            // SAFETY: `fds` is a valid, initialised array of pollfd for its length.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(CommError::io("poll", e));
            }
            if n == 0 {
                continue;
            }
            let mut dead = Vec::new();
            let mut ready = false;
            for (fd, &peer) in fds.iter().zip(&who) {
                let awaited = want.iter().any(|&(p, e)| p == peer && fd.revents & e != 0);
                if awaited {
                    ready = true; // data first: a hang-up after the last bytes is read later
                } else if fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
                    dead.push(peer);
                }
            }
            if !dead.is_empty() {
                return Err(self.lost_while(clock, dead, &waiting));
            }
            if ready {
                return Ok(());
            }
        }
    }

    /// Errors if the deadline passed (see [`Clock::check`]). A peer that has not
    /// acknowledged data sent to it for a while is named as lost rather than the
    /// rank waited for, whatever its heartbeats say: when a host or its link
    /// goes down, its neighbours wait on each other, and only the ones with
    /// bytes stuck on the way to it can tell.
    pub fn check_deadline(&self, clock: &mut Clock, waiting: &[usize]) -> Result<(), CommError> {
        if !clock.past_deadline() {
            return clock.check(waiting);
        }
        if !clock.look_due() {
            return Ok(());
        }
        let stuck = self.unacknowledged();
        if stuck.is_empty() {
            return clock.check(waiting);
        }
        let silent = stuck.iter().map(|&(_, d)| d).max().unwrap_or_default();
        let mut detail = format!(
            "no TCP acknowledgement of the data sent to it for {silent:.1?} (its host or link is down)"
        );
        let others: Vec<usize> =
            waiting.iter().copied().filter(|r| stuck.iter().all(|&(p, _)| p != *r)).collect();
        if !others.is_empty() {
            detail.push_str(&format!(", while waiting for rank(s) {others:?} for {:.1?}", clock.timeout));
        }
        Err(CommError::PeerLost {
            op: clock.op.clone(),
            ranks: stuck.into_iter().map(|(p, _)| p).collect(),
            detail,
        })
    }

    /// Peers with data in flight that the kernel is retransmitting and that
    /// has not been acknowledged for at least a second, with how long.
    fn unacknowledged(&self) -> Vec<(usize, Duration)> {
        self.peers
            .iter()
            .enumerate()
            .filter_map(|(peer, s)| {
                let info = tcp_info(s.as_ref()?)?;
                let silent = Duration::from_millis(u64::from(info.tcpi_last_ack_recv));
                let stuck =
                    info.tcpi_unacked > 0 && info.tcpi_retransmits > 0 && silent >= Duration::from_secs(1);
                stuck.then_some((peer, silent))
            })
            .collect()
    }

    /// Checks, without blocking, that no peer has hung up.
    pub fn check_alive(&self, clock: &Clock, waiting: &[usize]) -> Result<(), CommError> {
        let dead = self.hung_up();
        if dead.is_empty() { Ok(()) } else { Err(self.lost_while(clock, dead, waiting)) }
    }

    /// Peers in `dead` hung up while `waiting` was waited for. A rank that died
    /// first may be noticed second: a neighbour that saw it die can exit and
    /// hang up before the dead rank's own sockets close (the kernel frees a
    /// killed process's memory before its files). So the awaited ranks get a
    /// short grace to hang up too, and the ones that do are named as well.
    fn lost_while(&self, clock: &Clock, mut dead: Vec<usize>, waiting: &[usize]) -> CommError {
        let mut awaited: Vec<usize> = waiting.iter().copied().filter(|w| !dead.contains(w)).collect();
        awaited.dedup();
        let grace = Instant::now() + HANG_UP_GRACE;
        while !awaited.is_empty() {
            let left = grace.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let now_dead = self.hung_up_among(&awaited, left);
            if now_dead.is_empty() {
                break;
            }
            awaited.retain(|r| !now_dead.contains(r));
            dead.extend(now_dead);
        }
        dead.sort_unstable();
        dead.dedup();
        lost_while(clock, dead, waiting)
    }

    /// Which of `peers` hang up within `within` (one poll; zero does not block).
    fn hung_up_among(&self, peers: &[usize], within: Duration) -> Vec<usize> {
        let mut fds = Vec::new();
        let mut who = Vec::new();
        for &peer in peers {
            if let Some(Some(s)) = self.peers.get(peer) {
                fds.push(libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 });
                who.push(peer);
            }
        }
        let ms = within.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            return Vec::new();
        }
        fds.iter()
            .zip(&who)
            .filter(|(fd, _)| fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
            .map(|(_, &p)| p)
            .collect()
    }

    /// `peer` failed; every other peer that has hung up by now is named too (a
    /// rank that died first may be noticed second, through a neighbour's exit).
    fn lost(&self, clock: &Clock, peer: usize, what: &str) -> CommError {
        let mut ranks = self.hung_up();
        if !ranks.contains(&peer) {
            ranks.push(peer);
        }
        ranks.sort_unstable();
        CommError::PeerLost { op: clock.op.clone(), ranks, detail: what.to_string() }
    }

    /// Peers whose connection has hung up, checked without blocking.
    fn hung_up(&self) -> Vec<usize> {
        let all: Vec<usize> = (0..self.peers.len()).collect();
        self.hung_up_among(&all, Duration::ZERO)
    }

    /// Writes as much of `data` as the socket takes now; returns the count.
    pub fn try_send(&mut self, peer: usize, data: &[u8], clock: &Clock) -> Result<usize, CommError> {
        if data.is_empty() {
            return Ok(0);
        }
        match self.stream(peer).write(data) {
            Ok(n) => Ok(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(0),
            Err(e) => Err(self.lost(clock, peer, &format!("send failed: {e}"))),
        }
    }

    /// Reads what is available into `buf`; returns the count (0 if nothing yet).
    pub fn try_recv(&mut self, peer: usize, buf: &mut [u8], clock: &Clock) -> Result<usize, CommError> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.stream(peer).read(buf) {
            Ok(0) => Err(self.lost(clock, peer, "connection closed (the process exited or was killed)")),
            Ok(n) => Ok(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(0),
            Err(e) => Err(self.lost(clock, peer, &format!("receive failed: {e}"))),
        }
    }

    /// Profiling: a send to `peer` that began at `t` and moved `n` bytes,
    /// and the bytes its socket still queues unsent (`SIOCOUTQ`).
    fn time_send(&mut self, peer: usize, t: Instant, n: usize) {
        let elapsed = t.elapsed();
        let fd = self.stream(peer).as_raw_fd();
        let mut unsent: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int for a socket fd we own.
        let queued = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut unsent) } == 0;
        if let Some(x) = self.timing.as_mut() {
            x.send += elapsed;
            if n > 0 {
                x.sends += 1;
                let unsent = if queued { unsent.max(0) as u64 } else { 0 };
                x.unsent_sum += unsent;
                x.max_unsent = x.max_unsent.max(unsent);
            }
        }
    }

    /// Sends `send` to one peer while receiving exactly `recv.len()` bytes from
    /// another (possibly the same), calling `on_recv(total_received)` as bytes
    /// arrive. `send_hook(sent)` sees progress of the send.
    pub fn exchange(
        &mut self,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, &mut [u8])>,
        clock: &mut Clock,
        on_recv: impl FnMut(usize, &[u8]),
        send_hook: impl FnMut(usize),
    ) -> Result<(), CommError> {
        match recv {
            Some((from, buf)) => {
                let mut landing = Landing { buf, on_recv };
                self.exchange_into(send, Some((from, &mut landing)), clock, send_hook)
            }
            None => self.exchange_into(send, None, clock, send_hook),
        }
    }

    /// As [`Mesh::exchange`], the received bytes going wherever `recv`'s
    /// [`Inbox`] puts them.
    pub fn exchange_into(
        &mut self,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, &mut dyn Inbox)>,
        clock: &mut Clock,
        mut send_hook: impl FnMut(usize),
    ) -> Result<(), CommError> {
        let (to, out) = send.unwrap_or((usize::MAX, &[]));
        let mut nowhere = Landing { buf: &mut [], on_recv: |_: usize, _: &[u8]| {} };
        let (from, inbox): (usize, &mut dyn Inbox) = match recv {
            Some((p, b)) => (p, b),
            None => (usize::MAX, &mut nowhere),
        };
        let expected = inbox.total();
        let (mut sent, mut got) = (0usize, 0usize);
        let profiled = self.timing.is_some();
        let started = |on: bool| on.then(Instant::now);
        while sent < out.len() || got < expected {
            let mut progressed = false;
            if sent < out.len() {
                let t = started(profiled);
                let n = self.try_send(to, &out[sent..], clock)?;
                if let Some(t) = t {
                    self.time_send(to, t, n);
                }
                if n > 0 {
                    sent += n;
                    send_hook(sent);
                    progressed = true;
                }
            }
            if got < expected {
                let t = started(profiled);
                let n = self.try_recv(from, inbox.space(got, MAX_READ.min(expected - got)), clock)?;
                if let (Some(t), Some(x)) = (t, self.timing.as_mut()) {
                    x.recv += t.elapsed();
                }
                if n > 0 {
                    inbox.landed(got, n);
                    got += n;
                    progressed = true;
                }
            }
            if !progressed {
                let mut want = Vec::with_capacity(2);
                if sent < out.len() {
                    want.push((to, libc::POLLOUT));
                }
                if got < expected {
                    want.push((from, libc::POLLIN));
                }
                let t = started(profiled);
                self.wait(&want, clock)?;
                if let (Some(t), Some(x)) = (t, self.timing.as_mut()) {
                    x.wait += t.elapsed();
                }
            }
        }
        Ok(())
    }

    /// Sends `frame` to every peer and receives one length-prefixed frame from
    /// every peer; returns the bodies by rank (empty for self).
    pub fn all_to_all_frames(&mut self, frame: &[u8], clock: &mut Clock) -> Result<Vec<Vec<u8>>, CommError> {
        let world = self.world;
        let me = self.rank;
        let mut sent = vec![0usize; world];
        let mut heads = vec![[0u8; 4]; world];
        let mut head_got = vec![0usize; world];
        let mut bodies: Vec<Vec<u8>> = vec![Vec::new(); world];
        let mut body_got = vec![0usize; world];
        let mut body_len: Vec<Option<usize>> = vec![None; world];
        body_len[me] = Some(0);
        sent[me] = frame.len();
        loop {
            let mut progressed = false;
            let mut want = Vec::new();
            for p in (0..world).filter(|&p| p != me) {
                if sent[p] < frame.len() {
                    let n = self.try_send(p, &frame[sent[p]..], clock)?;
                    sent[p] += n;
                    progressed |= n > 0;
                    if sent[p] < frame.len() {
                        want.push((p, libc::POLLOUT));
                    }
                }
                if body_len[p].is_none() {
                    let n = self.try_recv(p, &mut heads[p][head_got[p]..], clock)?;
                    head_got[p] += n;
                    progressed |= n > 0;
                    if head_got[p] == 4 {
                        let len = u32::from_le_bytes(heads[p]) as usize;
                        if len > 1 << 20 {
                            return Err(self.lost(
                                clock,
                                p,
                                &format!("sent a malformed op header ({len} bytes)"),
                            ));
                        }
                        body_len[p] = Some(len);
                        bodies[p] = vec![0u8; len];
                    }
                }
                if let Some(len) = body_len[p]
                    && body_got[p] < len
                {
                    let n = self.try_recv(p, &mut bodies[p][body_got[p]..], clock)?;
                    body_got[p] += n;
                    progressed |= n > 0;
                }
                if body_len[p].is_none_or(|len| body_got[p] < len) {
                    want.push((p, libc::POLLIN));
                }
            }
            if want.is_empty() {
                return Ok(bodies);
            }
            if !progressed {
                self.wait(&want, clock)?;
            }
        }
    }
}

/// The most one `recv` takes.
pub(crate) const MAX_READ: usize = 256 << 10;

/// Where an exchange puts the bytes it receives.
pub(crate) trait Inbox {
    /// How many bytes the exchange receives.
    fn total(&self) -> usize;
    /// Room for the next bytes after `got` (at most `max`, at least one).
    fn space(&mut self, got: usize, max: usize) -> &mut [u8];
    /// `n` bytes after `got` were written at the start of the last `space`.
    fn landed(&mut self, got: usize, n: usize);
}

/// Bytes received into one buffer, in place; `on_recv(total, buf)` after each read.
struct Landing<'a, F: FnMut(usize, &[u8])> {
    buf: &'a mut [u8],
    on_recv: F,
}

impl<F: FnMut(usize, &[u8])> Inbox for Landing<'_, F> {
    fn total(&self) -> usize {
        self.buf.len()
    }

    fn space(&mut self, got: usize, max: usize) -> &mut [u8] {
        &mut self.buf[got..got + max]
    }

    fn landed(&mut self, got: usize, n: usize) {
        (self.on_recv)(got + n, self.buf);
    }
}

/// A peer hung up; if it is not the one waited for, say who was (a rank that failed
/// first, e.g. on its own deadline, may exit before the others notice why).
fn lost_while(clock: &Clock, dead: Vec<usize>, waiting: &[usize]) -> CommError {
    let mut detail = String::from("connection closed (the process exited or was killed)");
    let others: Vec<usize> = waiting.iter().copied().filter(|w| !dead.contains(w)).collect();
    if clock.warned && !others.is_empty() {
        return CommError::Stalled {
            op: clock.op.clone(),
            ranks: others,
            after: clock.start.elapsed(),
            hung_up: dead,
        };
    }
    if !others.is_empty() {
        detail.push_str(&format!(" while waiting for rank(s) {others:?} for {:.1?}", clock.start.elapsed()));
    }
    CommError::PeerLost { op: clock.op.clone(), ranks: dead, detail }
}

/// The kernel's view of a TCP connection (Linux); `None` where unavailable.
fn tcp_info(stream: &TcpStream) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid socket, a buffer of `len` bytes and its length.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info)
}

fn poll_one(fd: i32, events: i16, timeout: Duration) {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe {
        libc::poll(&mut p, 1, timeout.as_millis().clamp(1, 1000) as i32);
    }
}
