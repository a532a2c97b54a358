//! `cri SOCKET version|status|list`: a look at a CRI runtime from the shell (crictl is not
//! available here). The suites use the library directly.
use std::path::Path;
use std::time::Duration;

use containerd_conformance::cri::RuntimeClient;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: cri SOCKET version|status|list");
        std::process::exit(2);
    }
    let cri = match RuntimeClient::connect(Path::new(&args[1]), Duration::from_secs(10)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cri: cannot connect to {}: {e}", args[1]);
            std::process::exit(1);
        }
    };
    let outcome = match args[2].as_str() {
        "version" => cri.version().await.map(|v| format!("{v:#?}")),
        "status" => cri.status(true).await.map(|s| {
            let mut out = format!("{:#?}", s.status);
            for (k, v) in &s.info {
                out.push_str(&format!("\n{k}: {v}"));
            }
            out
        }),
        "list" => cri
            .list_pod_sandbox()
            .await
            .map(|items| format!("{items:#?}")),
        other => {
            eprintln!("cri: unknown command {other}");
            std::process::exit(2);
        }
    };
    match outcome {
        Ok(text) => println!("{text}"),
        Err(e) => {
            eprintln!("cri: {}: {}", args[2], e.message());
            std::process::exit(1);
        }
    }
}
