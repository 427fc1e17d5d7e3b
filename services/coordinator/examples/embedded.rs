//! A coordinator in-process: two workers rendezvous, record a few metric points,
//! and the mean loss per step is read back; then the server shuts down.
//!
//! `cargo run -p drove-coordinator --example embedded`
use drove_control::Clients;
use drove_proto::v1::{Aggregation, JoinRequest, MetricPoint, PushRequest, QueryRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let store = std::env::temp_dir().join(format!("drove-example-store-{}", std::process::id()));
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse()?,
        store: store.clone(),
        ..Default::default()
    };
    let server = drove_coordinator::start(&config).await?;
    let addr = server.addr().to_string();
    println!("coordinator on {addr}, store {}", store.display());

    let mut joins = Vec::new();
    for i in 0..2 {
        let mut c = Clients::connect(&addr, None).await?;
        joins.push(tokio::spawn(async move {
            let req = JoinRequest {
                run_id: "demo".into(),
                world_size: 2,
                address: format!("127.0.0.1:{}", 29500 + i),
                host: "localhost".into(),
                requested_rank: -1,
                timeout_ms: 10_000,
                restart_count: 0,
                ..Default::default()
            };
            c.rendezvous.join(req).await.map(|r| r.into_inner())
        }));
    }
    for j in joins {
        let r = j.await??;
        println!(
            "joined as rank {} of {}; peers {:?}",
            r.rank,
            r.world_size,
            r.peers.iter().map(|p| &p.address).collect::<Vec<_>>()
        );
    }

    let mut c = Clients::connect(&addr, None).await?;
    let points: Vec<MetricPoint> = (0..2)
        .flat_map(|rank| {
            (0..3).map(move |step| MetricPoint {
                run_id: "demo".into(),
                rank,
                step: step as f64,
                name: "loss".into(),
                value: 2.0 - 0.5 * step as f64 + 0.1 * rank as f64,
                wall_time_unix_ms: 0,
            })
        })
        .collect();
    let mut acks = c.metrics.push(tokio_stream::iter(vec![PushRequest { points }])).await?.into_inner();
    while let Some(ack) = acks.message().await? {
        println!("stored {} points", ack.stored);
    }
    let q = QueryRequest {
        run_id: "demo".into(),
        name: "loss".into(),
        aggregation: Aggregation::Mean as i32,
        ..Default::default()
    };
    for p in c.metrics.query(q).await?.into_inner().points {
        println!("step {}: mean loss {:.2} over {} ranks", p.step, p.value, p.count);
    }
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&store);
    Ok(())
}
