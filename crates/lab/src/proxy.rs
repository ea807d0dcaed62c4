//! A TCP proxy between the services and MySQL that the lab can cut: every connection through
//! it is dropped and new ones are refused for a while. This is how the `database-loss`
//! scenario takes the database away from running services without touching the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug)]
pub struct Proxy {
    pub address: SocketAddr,
    down_until: Arc<Mutex<Option<Instant>>>,
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("proxy: cannot bind")?;
        let address = listener.local_addr()?;
        let down_until = Arc::new(Mutex::new(None));
        let (cut, _) = watch::channel(0_u64);
        let task = tokio::spawn(accept(listener, upstream, down_until.clone(), cut.clone()));
        Ok(Proxy { address, down_until, cut, task })
    }

    /// Drops every connection now and refuses new ones for `duration`.
    pub fn outage(&self, duration: Duration) {
        *self.down_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + duration);
        self.cut.send_modify(|generation| *generation += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    down_until: Arc<Mutex<Option<Instant>>>,
    cut: watch::Sender<u64>,
) {
    while let Ok((inbound, _)) = listener.accept().await {
        let down = down_until.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|until| Instant::now() < until);
        if down {
            drop(inbound);
            continue;
        }
        let mut cut = cut.subscribe();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
            let mut inbound = inbound;
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = cut.changed() => {}
            }
        });
    }
}
