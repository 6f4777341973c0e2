use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

// Every request allocates its messages and frames on whichever worker thread runs it and frees
// them on another; glibc's malloc spent a sixth of a get's CPU time on that (and on its arena
// locks), mimalloc's per-thread free lists far less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = etcdsql::Config::parse();
    let filter = EnvFilter::try_new(&config.log_level)
        .with_context(|| format!("invalid --log-level {:?}", config.log_level))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    if config.log_format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }

    let shutdown = CancellationToken::new();
    let running = etcdsql::start(config, shutdown.clone())
        .await
        .context("etcdsql failed to start")?;
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    running
        .wait()
        .await
        .context("etcdsql stopped with an error")
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only ctrl-c stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
