//! Server processes that cannot outlive their owner.
//!
//! The shared control plane lives in a `static`, and Rust never drops statics, so "kill on
//! Drop" alone would leave etcd and kube-apiserver running after every test binary. Instead
//! each server runs under a small `sh` supervisor whose stdin is a pipe from this process
//! (the *lifeline*). Nothing is ever written to it; the supervisor blocks reading it and gets
//! end-of-file exactly when the last write end closes, which the kernel does when this
//! process exits for any reason (normal exit, panic, abort, SIGKILL) or when the owner drops
//! the [`Supervised`]. It then stops the server: SIGTERM, then SIGKILL after 1 s (a graceful
//! shutdown is worth nothing for test servers, and etcd would wait for the API server's open
//! watches).
//!
//! Why not the alternatives: `prctl(PR_SET_PDEATHSIG)` needs `unsafe` `pre_exec` (forbidden in
//! this workspace) and fires when the spawning *thread* exits, which for a test would be the
//! end of the first test, not of the binary; a process group or `setsid` needs someone alive
//! to send the signal. Rust creates pipes close-on-exec, so other processes spawned by the
//! tests never inherit a write end and cannot keep a server alive.
//!
//! A third supervised process, the janitor, removes the temporary folder the same way: it is
//! the one clean-up that must also happen for the `static` control plane.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};

use crate::TestbedError;

/// Supervisor: runs "$@" in the background and stops it when stdin reaches end-of-file;
/// exits with the server's status when the server exits on its own. The server's process id
/// goes to `$SUPERVISED_PID_FILE`, so a test can signal the server itself (a crash is a
/// SIGKILL to the server, not to the supervisor).
const SUPERVISOR: &str = r#"
exec 3<&0
"$@" </dev/null 3<&- &
server=$!
if [ -n "$SUPERVISED_PID_FILE" ]; then echo "$server" >"$SUPERVISED_PID_FILE"; fi
(
  while read -r _ <&3; do :; done
  kill -TERM "$server" 2>/dev/null
  i=0
  while kill -0 "$server" 2>/dev/null && [ "$i" -lt 10 ]; do sleep 0.1; i=$((i + 1)); done
  kill -KILL "$server" 2>/dev/null
) </dev/null &
watcher=$!
exec 3<&-
wait "$server"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"#;

/// Janitor: waits for end-of-file on stdin, then removes the folder `$1`. The servers stop at
/// the same moment and may still be writing, so it retries for up to 15 s until the folder is
/// gone.
const JANITOR: &str = r#"
while read -r _; do :; done
i=0
while [ -e "$1" ] && [ "$i" -lt 30 ]; do
  rm -rf "$1" 2>/dev/null || sleep 0.5
  i=$((i + 1))
done
"#;

/// A process running under a lifeline supervisor.
#[derive(Debug)]
pub(crate) struct Supervised {
    name: String,
    child: Child,
    lifeline: Option<ChildStdin>,
    log: PathBuf,
    /// What was started, for [`Supervised::respawn`] (empty for the janitor).
    program: PathBuf,
    args: Vec<String>,
}

// === impl Supervised ===

impl Supervised {
    /// Starts `program args` under a supervisor, output written to `log` (truncated first, so
    /// that a retried start-up reads only its own messages).
    pub(crate) fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self, TestbedError> {
        Self::spawn_logging(name, program, args, log, false)
    }

    /// Starts the same program with the same arguments again, its output appended to the same
    /// log (a restart keeps what the stopped server wrote).
    pub(crate) fn respawn(&self) -> Result<Self, TestbedError> {
        Self::spawn_logging(
            &self.name,
            &self.program,
            &self.args,
            self.log.clone(),
            true,
        )
    }

    fn spawn_logging(
        name: &str,
        program: &Path,
        args: &[String],
        log: PathBuf,
        append: bool,
    ) -> Result<Self, TestbedError> {
        let out = File::options()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&log)
            .map_err(TestbedError::io(format!("opening {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(TestbedError::io("duplicating a log file handle"))?;
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(SUPERVISOR)
            .arg(format!("supervise-{name}"))
            .arg(program)
            .args(args)
            .env("SUPERVISED_PID_FILE", pid_file(&log));
        let _ = std::fs::remove_file(pid_file(&log));
        let mut supervised = Self::start(name, command, Stdio::from(out), Stdio::from(err), log)?;
        supervised.program = program.to_path_buf();
        supervised.args = args.to_vec();
        Ok(supervised)
    }

    /// Starts the janitor that removes `dir` once this process is gone or the janitor is
    /// stopped.
    pub(crate) fn janitor(dir: &Path) -> Result<Self, TestbedError> {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(JANITOR)
            .arg("testbed-janitor")
            .arg(dir);
        Self::start(
            "janitor",
            command,
            Stdio::null(),
            Stdio::null(),
            PathBuf::new(),
        )
    }

    fn start(
        name: &str,
        mut command: Command,
        out: Stdio,
        err: Stdio,
        log: PathBuf,
    ) -> Result<Self, TestbedError> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(TestbedError::io(format!("starting {name}")))?;
        let lifeline = child.stdin.take();
        Ok(Self {
            name: name.to_string(),
            child,
            lifeline,
            log,
            program: PathBuf::new(),
            args: Vec::new(),
        })
    }

    /// The server's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal` (`KILL`, `TERM`, ...) to the server itself and waits up to `timeout` for
    /// it to exit; `false` when it is still running then (the caller may escalate).
    pub(crate) async fn signal_and_wait(
        &mut self,
        signal: &str,
        timeout: std::time::Duration,
    ) -> Result<bool, TestbedError> {
        if self.exited().is_some() {
            return Ok(true);
        }
        let pid = self.server_pid().ok_or_else(|| TestbedError::Io {
            context: format!("reading the process id of {}", self.name),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no pid file"),
        })?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(TestbedError::io(format!("signalling {}", self.name)))?;
        if !status.success() && self.exited().is_none() {
            return Err(TestbedError::Io {
                context: format!("kill -{signal} {pid} ({})", self.name),
                source: std::io::Error::other(status.to_string()),
            });
        }
        let deadline = crate::wait::Deadline::after(timeout);
        while !deadline.passed() {
            if self.exited().is_some() {
                return Ok(true);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(self.exited().is_some())
    }

    /// The server's process id, as the supervisor wrote it (None once it has exited).
    pub(crate) fn pid(&mut self) -> Option<u32> {
        if self.exited().is_some() {
            return None;
        }
        self.server_pid()
    }

    /// The server's process id, as the supervisor wrote it.
    fn server_pid(&self) -> Option<u32> {
        // The supervisor writes the file right after starting the server; a server signalled
        // at once may need a moment.
        for _ in 0..100 {
            if let Some(pid) = std::fs::read_to_string(pid_file(&self.log))
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                return Some(pid);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }

    /// The server's log file.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the server has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of the server's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Stops the server and waits (up to about 10 s) for the supervisor to exit.
    pub(crate) fn stop(&mut self) {
        // Closing our end of the lifeline is the stop signal.
        drop(self.lifeline.take());
        for _ in 0..200 {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        eprintln!("testbed: {} did not stop in time; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where the supervisor of the server logging to `log` writes the server's process id.
fn pid_file(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".pid");
    PathBuf::from(name)
}

/// A port on 127.0.0.1 that was free a moment ago. Another process may take it before the
/// server binds it; callers retry start-up when the server reports "address already in use".
pub(crate) fn free_port() -> Result<u16, TestbedError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(TestbedError::io("finding a free port on 127.0.0.1"))
}

/// Whether a server's log says it lost a port race.
pub(crate) fn lost_port_race(log: &Path) -> bool {
    tail(log, 200).contains("address already in use")
}

/// The last `lines` lines of a file, read from at most its last 256 KiB.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 256 * 1024;
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(error) => format!("(cannot read {}: {error})", path.display()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Polls `exited` for up to 10 s (the supervisor needs a moment to notice).
    fn wait_exit(process: &mut Supervised) -> Option<ExitStatus> {
        for _ in 0..200 {
            if let Some(status) = process.exited() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }

    #[test]
    fn closing_the_lifeline_stops_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let args = ["1000".to_string()];
        let mut sleeper =
            Supervised::spawn("sleep", Path::new("sleep"), &args, dir.path().join("log")).unwrap();
        assert!(sleeper.exited().is_none(), "still running");
        drop(sleeper.lifeline.take());
        let status = wait_exit(&mut sleeper).expect("supervisor exits once the lifeline closes");
        assert!(!status.success(), "the server was killed: {status}");
    }

    #[test]
    fn a_server_exiting_on_its_own_is_reported_with_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "-c".to_string(),
            "echo listen: address already in use; exit 3".to_string(),
        ];
        let log = dir.path().join("log");
        let mut server = Supervised::spawn("sh", Path::new("sh"), &args, log.clone()).unwrap();
        let status = wait_exit(&mut server).unwrap();
        assert_eq!(status.code(), Some(3));
        assert!(lost_port_race(&log));
        assert_eq!(server.log_tail(1), "listen: address already in use");
    }

    #[test]
    fn the_janitor_removes_the_folder_when_stopped() {
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("file"), "x").unwrap();
        let mut janitor = Supervised::janitor(&dir).unwrap();
        janitor.stop();
        assert!(!dir.exists());
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "1\n2\n3\n").unwrap();
        assert_eq!(tail(&path, 2), "2\n3");
        assert!(tail(&dir.path().join("missing"), 2).contains("cannot read"));
    }
}
