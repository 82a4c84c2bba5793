//! Metrics over HTTP for a Prometheus server to scrape: `uzswap stats PID
//! --serve ADDR` (from outside, for any tree) and `uzswap run --metrics
//! ADDR` (from the run itself, for as long as it runs).
//!
//! `GET /metrics` answers the exposition `uzswap stats --prometheus`
//! prints (`crate::metrics`), read afresh at each scrape: the ledger, then
//! every process's own statistics over its socket. Requests are served one
//! at a time on one thread; a scrape asks the tree's processes in parallel
//! (`view::ask_all`). Nothing is cached, so nothing can be stale.

use anyhow::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tiny_http::{Header, Method, Request, Response, Server};

/// The exposition format's content type (text format 0.0.4).
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// How often a server waiting for requests checks whether to stop.
const POLL: Duration = Duration::from_millis(200);

/// Listens on `addr` (`HOST:PORT`; port 0 picks a free one).
pub fn bind(addr: &str) -> Result<Server> {
    use std::net::ToSocketAddrs;
    let mut addrs = addr.to_socket_addrs().with_context(|| {
        format!("{addr:?} is not an address to listen on: give HOST:PORT, e.g. 127.0.0.1:9187")
    })?;
    let a = addrs
        .next()
        .with_context(|| format!("{addr:?} names no address: give HOST:PORT"))?;
    Server::http(a).map_err(|e| {
        anyhow::anyhow!("cannot listen on {a} ({e}): pick a free port, or 127.0.0.1:0 for any")
    })
}

/// The address `server` listens on, as a URL of its metrics.
pub fn url(server: &Server) -> String {
    match server.server_addr().to_ip() {
        Some(a) => format!("http://{a}/metrics"),
        None => "the unix socket's /metrics".into(),
    }
}

/// Serves the metrics of the tree of `uzswap run` `run_pid` until `stop`
/// says so (checked every [`POLL`] and after each request).
pub fn serve(server: &Server, run_pid: u32, stop: &dyn Fn() -> bool) {
    while !stop() {
        match server.recv_timeout(POLL) {
            Ok(Some(req)) => answer(req, run_pid),
            Ok(None) => {}
            Err(e) => {
                crate::note(&format!("uzswap: metrics endpoint stopped: {e}"));
                return;
            }
        }
    }
}

/// The metrics endpoint of a `uzswap run` on a thread of its own.
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Serves the tree of this `uzswap run` process on `server`.
    pub fn start(server: Server) -> Result<Endpoint> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let me = std::process::id();
        let thread = std::thread::Builder::new()
            .name("uzswap-metrics".into())
            .spawn(move || serve(&server, me, &|| s.load(Ordering::Relaxed)))?;
        Ok(Endpoint {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one request.
fn answer(req: Request, run_pid: u32) {
    let (code, body, content_type) = match (req.method(), req.url()) {
        (Method::Get | Method::Head, "/metrics") => match scrape(run_pid) {
            Ok(text) => (200, text, CONTENT_TYPE),
            // The tree has ended (or cannot be read): a scrape error
            // Prometheus records, with why.
            Err(e) => (503, format!("{e:#}\n"), "text/plain; charset=utf-8"),
        },
        (Method::Get | Method::Head, "/") => (
            200,
            format!("uzswap run {run_pid}: metrics at /metrics\n"),
            "text/plain; charset=utf-8",
        ),
        (Method::Get | Method::Head, other) => (
            404,
            format!("no page {other}: the metrics are at /metrics\n"),
            "text/plain; charset=utf-8",
        ),
        (m, _) => (
            405,
            format!("{m} is not served: GET /metrics\n"),
            "text/plain; charset=utf-8",
        ),
    };
    let header = Header::from_bytes("Content-Type", content_type).expect("a valid header");
    let resp = Response::from_string(body)
        .with_status_code(code)
        .with_header(header);
    // A scraper that hung up is not our error.
    let _ = req.respond(resp);
}

/// The exposition of the tree now.
fn scrape(run_pid: u32) -> Result<String> {
    let v = crate::view::tree(run_pid, false)?;
    let details = crate::view::ask_all(&v)?;
    Ok(crate::metrics::tree_prometheus(&v, &details))
}

/// `uzswap stats PID --serve ADDR`: serves the tree `pid` belongs to
/// until its `uzswap run` exits.
pub fn serve_tree(pid: u32, addr: &str) -> Result<()> {
    // Checked first: a pid of no tree is an error now, not at a scrape.
    let run_pid = crate::view::tree(pid, true)?.run_pid;
    let server = bind(addr)?;
    crate::note(&format!(
        "uzswap: serving the metrics of `uzswap run` {run_pid} at {}; stops when it exits",
        url(&server)
    ));
    let gone = || !std::path::Path::new(&format!("/proc/{run_pid}")).exists();
    serve(&server, run_pid, &gone);
    crate::note(&format!(
        "uzswap: `uzswap run` {run_pid} has exited: metrics endpoint closed"
    ));
    Ok(())
}
