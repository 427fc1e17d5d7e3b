//! Heartbeats: a joined rank or member tells the coordinator it is alive, and
//! hears whether its world should re-form and when its peers last beat.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::connect::{Clients, Connection};
use drove_collective::{Rank, ReformCause};
use drove_proto::v1::{HeartbeatRequest, HeartbeatResponse};

use crate::wire::{cause_from_wire, wire_rank};

/// How often a joined rank sends a heartbeat by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);

/// Who sends heartbeats: a rank of a fixed world, or a member of an elastic
/// run (whose generation changes, and who hears that its world should re-form).
pub(crate) enum Beating {
    /// A rank of a fixed world.
    Rank(Rank),
    /// A member of an elastic run.
    Member(String, Arc<Beat>),
}

/// What an elastic member's heartbeats carry and hear.
#[derive(Debug, Default)]
pub(crate) struct Beat {
    /// The generation the member runs in.
    pub generation: AtomicU64,
    /// The coordinator said a newer generation is forming.
    pub reform: AtomicBool,
    /// Why, as it said.
    pub cause: Mutex<Option<ReformCause>>,
    /// When the other members of its generation last beat, as last heard.
    pub peers: Mutex<Option<PeerBeats>>,
}

/// The coordinator's last word on when each member of a generation beat.
#[derive(Debug)]
pub(crate) struct PeerBeats {
    /// The generation it is about.
    pub generation: u64,
    /// When the answer came.
    pub heard: Instant,
    /// Member id -> time since its last beat, at `heard`.
    pub since: HashMap<String, Duration>,
}

impl Beating {
    fn request(&self, run_id: &str) -> HeartbeatRequest {
        match self {
            Beating::Rank(rank) => {
                HeartbeatRequest { run_id: run_id.to_string(), rank: wire_rank(*rank), ..Default::default() }
            }
            Beating::Member(id, beat) => HeartbeatRequest {
                run_id: run_id.to_string(),
                member_id: id.clone(),
                generation: beat.generation.load(Ordering::SeqCst) as i64,
                ..Default::default()
            },
        }
    }

    /// Takes in the answer to a heartbeat sent for `generation`.
    fn heard(&self, response: &HeartbeatResponse, generation: u64) {
        if let Beating::Member(_, beat) = self {
            let since = response
                .member_beats
                .iter()
                .map(|b| (b.member_id.clone(), Duration::from_millis(u64::try_from(b.since_ms).unwrap_or(0))))
                .collect();
            *beat.peers.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(PeerBeats { generation, heard: Instant::now(), since });
        }
        if let Beating::Member(_, beat) = self
            && response.reform
            && response.generation as u64 > beat.generation.load(Ordering::SeqCst)
        {
            let cause = response.reform_cause.as_ref().map(cause_from_wire);
            *beat.cause.lock().unwrap_or_else(|e| e.into_inner()) = cause;
            beat.reform.store(true, Ordering::SeqCst);
        }
    }
}

/// Sends a heartbeat for `who` every `every`, on the control plane's
/// runtime, for as long as the process lives (a stopped or hung process stops sending, which is the point); a
/// coordinator that is away is tried again at the next beat.
pub(crate) fn spawn_heartbeats(connection: Connection, run_id: String, who: Beating, every: Duration) {
    let beat = async move {
        {
            let mut clients: Option<Clients> = None;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let call = async {
                    if clients.is_none() {
                        clients = Some(connection.connect().await.map_err(|e| e.to_string())?);
                    }
                    let c = clients.as_mut().expect("connected above");
                    let request = who.request(&run_id);
                    let generation = u64::try_from(request.generation).unwrap_or(0);
                    let response =
                        c.rendezvous.heartbeat(request).await.map_err(|s| s.message().to_string())?;
                    Ok::<_, String>((response, generation))
                };
                match tokio::time::timeout(every.max(Duration::from_secs(1)) * 2, call).await {
                    Ok(Ok((response, generation))) => who.heard(response.get_ref(), generation),
                    Ok(Err(e)) => {
                        tracing::debug!("heartbeat to {} failed: {e}", connection.addr);
                        clients = None;
                    }
                    Err(_) => clients = None,
                }
            }
        }
    };
    match crate::runtime::runtime() {
        Ok(runtime) => drop(runtime.spawn(beat)),
        Err(e) => tracing::warn!("cannot send heartbeats ({e}): this rank cannot be watched for hangs"),
    }
}
