//! The one async runtime of the control plane's clients: every call drove
//! makes to a coordinator, from any thread, runs on it, and so do the
//! heartbeats. It starts at the first call, with one worker thread.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Runtime;

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The runtime, started at the first call; an error saying why it could not
/// start (it is not tried again).
pub fn runtime() -> Result<&'static Runtime, std::io::Error> {
    let built = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("drove-control")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    built.as_ref().map_err(|e| std::io::Error::other(format!("starting the coordinator client: {e}")))
}

/// Runs `future` to its end on the calling thread (which must not be one of
/// the runtime's own), its timers and connections driven by the runtime.
pub fn block_on<F: Future>(future: F) -> Result<F::Output, std::io::Error> {
    Ok(runtime()?.block_on(future))
}

/// Resolves on SIGINT or SIGTERM (on SIGINT only where SIGTERM cannot be
/// caught). Poll it inside a tokio runtime, [`runtime`]'s say.
pub async fn interrupted() {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
