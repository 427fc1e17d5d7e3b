//! Lists the runs a coordinator knows, with the generated client.
//!
//! `cargo run -p drove-control --example list_runs -- HOST:PORT [TOKEN]`
//! (start one with `drove coordinator --listen 127.0.0.1:50051`).
use drove_control::Clients;
use drove_proto::v1::ListRunsRequest;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().ok_or("usage: list_runs HOST:PORT [TOKEN]")?;
    let token = args.next();
    let mut clients = Clients::connect(&addr, token.as_deref()).await?;
    let runs = clients.metrics.list_runs(ListRunsRequest {}).await?.into_inner().runs;
    if runs.is_empty() {
        println!("no runs on {addr}");
    }
    for r in runs {
        println!(
            "{:<24} {:<12} world {:>3}  joined {:>3}  points {}",
            r.run_id,
            r.state(),
            r.world_size,
            r.joined,
            r.points
        );
    }
    Ok(())
}
