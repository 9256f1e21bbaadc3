//! `kube-apiserver-inmem`: the in-memory API server as a process of its own, for clients in
//! other processes or containers (deploy/image-test.sh runs the host image against it with an
//! in-cluster configuration). Serves until SIGTERM or SIGINT; prints its URL on stdout once it
//! accepts connections, after the files it was asked for are written.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use kube_apiserver_inmem::{ApiServer, ApiServerOptions, ServingIdentity};

/// The in-memory Kubernetes API server (the one ccm-host's sandbox and tests use), on its own.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Serve HTTPS with a CA made at start (written with the kubeconfig and in-cluster files).
    #[arg(long)]
    tls: bool,
    /// Write a kubeconfig for this server here.
    #[arg(long, value_name = "PATH")]
    kubeconfig_out: Option<PathBuf>,
    /// Write a pod's service-account files here (`token`, `namespace`, and `ca.crt` with --tls),
    /// as the kubelet mounts them at /var/run/secrets/kubernetes.io/serviceaccount.
    #[arg(long, value_name = "DIR")]
    in_cluster_dir: Option<PathBuf>,
    /// Also write the chosen port to this file (useful with --listen 127.0.0.1:0).
    #[arg(long, value_name = "PATH")]
    port_file: Option<PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match serve(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let tls = if args.tls {
        Some(ServingIdentity::generate()?)
    } else {
        None
    };
    let server = ApiServer::start_with(ApiServerOptions {
        addr: args.listen,
        tls,
        ..Default::default()
    })
    .await?;
    if let Some(dir) = &args.in_cluster_dir {
        server.write_in_cluster_files(dir, kube_apiserver_inmem::KUBECONFIG_TOKEN)?;
    }
    if let Some(path) = &args.kubeconfig_out {
        server.write_kubeconfig(path)?;
    }
    if let Some(path) = &args.port_file {
        std::fs::write(path, server.addr().port().to_string())?;
    }
    println!("{}", server.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    server.shutdown().await;
    Ok(())
}
