//! Throw-away Redis servers for tests and benchmarks: a single node or a
//! three-master cluster on free loopback ports, without persistence,
//! killed (and their files removed) when the guard drops, panics included.
//!
//! The server is `redis-server` (or `valkey-server`) from `PATH`; when
//! neither is installed, [`Server::start`] and [`Cluster::start`] print
//! [`SKIP`] and return `None`, and the caller returns (`.ci/run` installs
//! the server, so CI always runs these tests).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a test prints when it cannot run.
pub const SKIP: &str = "skipped: redis-server not installed (.ci/run installs it)";

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// The server binary, if installed.
pub fn server_binary() -> Option<PathBuf> {
    on_path(&["redis-server", "valkey-server"])
}

/// The command-line client (for `--cluster create`), if installed.
pub fn cli_binary() -> Option<PathBuf> {
    on_path(&["redis-cli", "valkey-cli"])
}

/// A loopback port nothing listens on now. A cluster node also listens
/// on its port + 10000 (its bus), so for one that port must be at most
/// 55535 and free too: the kernel hands out ports up to 60999 here, and a
/// node given one above 55535 exits at once (its bus port would be past
/// 65535).
fn free_port(cluster: bool) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let bus_free = || {
            port.checked_add(BUS_OFFSET)
                .is_some_and(|bus| TcpListener::bind(("127.0.0.1", bus)).is_ok())
        };
        if !cluster || bus_free() {
            return port;
        }
    }
}

/// A cluster node's bus port is its port plus this.
const BUS_OFFSET: u16 = 10_000;

/// One running server process.
pub struct Server {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    cluster: bool,
}

impl Server {
    /// A single node, or `None` (after printing [`SKIP`]) when no server
    /// is installed.
    pub fn start() -> Option<Server> {
        Server::start_mode(false)
    }

    fn start_mode(cluster: bool) -> Option<Server> {
        if server_binary().is_none() {
            eprintln!("{SKIP}");
            return None;
        }
        // A free port may be taken by another test before the server binds
        // it: then another port.
        for _ in 0..5 {
            let port = free_port(cluster);
            let dir =
                std::env::temp_dir().join(format!("uzswap-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a directory for the server's files");
            let mut s = Server {
                child: None,
                port,
                dir,
                cluster,
            };
            if s.spawn() {
                return Some(s);
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts the process; whether it is the one answering on the port.
    fn spawn(&mut self) -> bool {
        let bin = server_binary().expect("checked at start");
        let mut cmd = Command::new(bin);
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &self.dir.display().to_string()]);
        if self.cluster {
            let conf = self.dir.join(format!("nodes-{}.conf", self.port));
            let _ = std::fs::remove_file(&conf);
            cmd.args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &conf.display().to_string()]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let pid = child.id();
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            // One that exited (its port taken meanwhile): another port.
            if self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
            {
                self.child = None;
                return false;
            }
            assert!(Instant::now() < until, "redis-server never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        let info: redis::RedisResult<String> = redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("INFO").arg("server").query(&mut c));
        let ours = info.is_ok_and(|i| i.lines().any(|l| l.trim() == format!("process_id:{pid}")));
        if !ours {
            self.kill();
        }
        ours
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it (SIGKILL) and waits for it: a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty (nothing was saved).
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "redis-server did not start again on its port");
    }

    /// A connection of its own, for inspection and damage behind the
    /// store's back.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("a connection to the test server")
    }

    /// Keys it holds (`DBSIZE`).
    pub fn dbsize(&self) -> u64 {
        redis::cmd("DBSIZE").query(&mut self.conn()).unwrap()
    }

    /// Every key it holds (`SCAN`).
    pub fn keys(&self) -> Vec<String> {
        let mut c = self.conn();
        let (mut cursor, mut keys) = (0u64, Vec::new());
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query(&mut c)
                .unwrap();
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three masters joined into a cluster (no replicas).
pub struct Cluster {
    /// The nodes.
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts three nodes and joins them; waits for `cluster_state:ok` on
    /// each. `None` (after printing [`SKIP`]) when no server is installed.
    pub fn start() -> Option<Cluster> {
        let cli = cli_binary();
        if server_binary().is_none() || cli.is_none() {
            eprintln!("{SKIP}");
            return None;
        }
        let nodes: Vec<Server> = (0..3)
            .map(|_| Server::start_mode(true).expect("checked"))
            .collect();
        let mut create = Command::new(cli.expect("checked"));
        create.args(["--cluster", "create"]);
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .current_dir(nodes[0].dir())
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let until = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut n.conn())
                    .unwrap();
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < until, "the cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(Cluster { nodes })
    }

    /// `redis://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis://{}", hosts.join(","))
    }

    /// Keys held by each node.
    pub fn dbsizes(&self) -> Vec<u64> {
        self.nodes.iter().map(Server::dbsize).collect()
    }

    /// Moves `slots` hash slots, with their keys, from node `from` to node
    /// `to` (`redis-cli --cluster reshard`): a topology change under a
    /// client that still has the old slot map.
    pub fn move_slots(&self, from: usize, to: usize, slots: u32) {
        let id = |n: &Server| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut n.conn())
                .unwrap()
        };
        let out = Command::new(cli_binary().expect("a cluster implies the client"))
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", self.nodes[from].port()))
            .args(["--cluster-from", &id(&self.nodes[from])])
            .args(["--cluster-to", &id(&self.nodes[to])])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
