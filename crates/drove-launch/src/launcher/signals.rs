//! SIGINT, SIGTERM and SIGHUP as events of the supervisor.

use std::sync::mpsc;

use tokio::signal::unix::{SignalKind, signal};

use crate::error::LaunchError;
use crate::launcher::spawn::SupervisorEvent;

/// Forwards SIGINT, SIGTERM and SIGHUP to `tx`. The handlers are installed before
/// this returns, so from then on these signals no longer end the process.
pub(crate) fn forward_signals(
    rt: &tokio::runtime::Runtime,
    tx: mpsc::Sender<SupervisorEvent>,
) -> Result<(), LaunchError> {
    let _guard = rt.enter();
    let install = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| LaunchError::io(format!("installing the {name} handler"), e))
    };
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut hup = install(SignalKind::hangup(), "SIGHUP")?;
    rt.spawn(async move {
        loop {
            let sig = tokio::select! {
                Some(()) = int.recv() => libc::SIGINT,
                Some(()) = term.recv() => libc::SIGTERM,
                Some(()) = hup.recv() => libc::SIGHUP,
                else => return,
            };
            if tx.send(SupervisorEvent::Signal(sig)).is_err() {
                return;
            }
        }
    });
    Ok(())
}
