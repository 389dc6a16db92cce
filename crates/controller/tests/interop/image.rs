//! The container image's runtime conditions, checked without a container engine (none runs on
//! the machines these tests were written on; `.ci/run` builds the image when one does).
//!
//! The Dockerfile's stages are read and checked against what this test reproduces: the build
//! stage's `cargo build --locked --release -p external-endpoints` (here: the same package's
//! binary as cargo built it for the tests, a debug build, to keep CI's build cost down), the
//! runtime stage's `USER 65532:65532` and entrypoint, and the Deployment's
//! `readOnlyRootFilesystem`. The binary is copied as the image copies it, then run as uid/gid
//! 65532 with no supplementary groups and `no_new_privs`, inside a private mount namespace whose
//! root is remounted read-only (`unshare` + `setpriv`, as root). It must become ready, lead,
//! write slices, and exit 0 on SIGTERM.

use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Stdio,
};

use kube::config::Kubeconfig;
use slices::testing;
use tokio::process::Command;

use super::contender::SHORT;
use harness::{CONVERGE, Cluster, eventually, http_get, sum_metric};

const DOCKERFILE: &str = include_str!("../../../../Dockerfile");
const DEPLOYMENT: &str = include_str!("../../../../deploy/deployment.yaml");

/// The runtime user of the image.
const UID: u32 = 65532;

pub async fn run(testbed: &'static testbed::Testbed) {
    check_stages();
    if !can_isolate() {
        assert!(
            !testbed::running_in_ci(),
            "unshare/setpriv as root are needed for the image check"
        );
        eprintln!("image check skipped: needs root, unshare and setpriv");
        return;
    }
    let cluster = Cluster::new(testbed, "interop-image").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // COPY --from=build /external-endpoints /usr/local/bin/external-endpoints
    let binary = dir.path().join("external-endpoints");
    std::fs::copy(env!("CARGO_BIN_EXE_external-endpoints"), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kubeconfig = readable_kubeconfig(testbed, dir.path());
    let log = dir.path().join("controller.log");

    let timing_args = SHORT.our_args();
    let script = "mount -o remount,bind,ro / && exec setpriv --reuid 65532 --regid 65532 \
                  --clear-groups --no-new-privs -- \"$0\" \"$@\"";
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(&binary)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "--identity",
            "image",
            "--watch-namespace",
            &cluster.namespace,
        ])
        .args(["--lease-namespace", &cluster.namespace])
        .args(["--admin-addr", "127.0.0.1:0", "--log-format", "json"])
        .args(&timing_args)
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let admin: SocketAddr = eventually("the admin address", CONVERGE, || async {
        read_log()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find_map(|entry| entry.get("admin")?.as_str()?.parse().ok())
            .ok_or_else(|| format!("log so far:\n{}", read_log()))
    })
    .await;

    // The process really runs as 65532 with a read-only root.
    let pid = child.id().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line
            .split_whitespace()
            .skip(1)
            .all(|id| id == UID.to_string()),
        "{uid_line}"
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|line| line.split_whitespace().nth(4) == Some("/"))
        .unwrap();
    let options = root.split_whitespace().nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "root mounted {options}"
    );

    eventually("leading", CONVERGE, || async {
        let (_, body) = http_get(admin, "/metrics").await?;
        match sum_metric(&body, "external_endpoints_leader", "") {
            Some(1.0) => Ok(()),
            other => Err(format!("leader {other:?}; log:\n{}", read_log())),
        }
    })
    .await;
    cluster.create_service(testing::web()).await;
    cluster
        .apply_workload(testing::vm("vm-1", "10.0.0.1"))
        .await;
    cluster.wait_converged().await;
    assert_eq!(cluster.slices_of("web").await.len(), 1);

    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exit = tokio::time::timeout(CONVERGE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "exit {exit:?}; log:\n{}", read_log());
    assert!(read_log().contains("released the lease"));
}

/// The Dockerfile builds the package's release binary and runs it as 65532; the Deployment
/// asks for a read-only root.
fn check_stages() {
    let lines: Vec<&str> = DOCKERFILE.lines().map(str::trim).collect();
    assert!(
        DOCKERFILE.contains("cargo build --locked --release -p external-endpoints"),
        "the build stage builds the external-endpoints package"
    );
    assert!(
        lines.contains(&"USER 65532:65532"),
        "the runtime stage's user"
    );
    assert!(
        lines.contains(&r#"ENTRYPOINT ["/usr/local/bin/external-endpoints"]"#),
        "the entrypoint"
    );
    assert!(lines.contains(&"EXPOSE 9990"), "the admin port");
    for wanted in [
        "readOnlyRootFilesystem: true",
        "runAsUser: 65532",
        "runAsNonRoot: true",
    ] {
        assert!(
            DEPLOYMENT.contains(wanted),
            "deploy/deployment.yaml: {wanted}"
        );
    }
}

/// Whether this process may build the namespace (root, with unshare and setpriv).
fn can_isolate() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"));
    let found = |tool: &str| {
        std::process::Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    root && found("unshare") && found("setpriv")
}

/// A copy of the testbed's kubeconfig, and of the PEM files it names, readable by 65532.
fn readable_kubeconfig(testbed: &testbed::Testbed, dir: &Path) -> PathBuf {
    let mut kubeconfig = Kubeconfig::read_from(testbed.kubeconfig_path()).unwrap();
    let copy = |path: &mut Option<String>, name: &str| {
        if let Some(original) = path.as_ref() {
            let target = dir.join(name);
            std::fs::copy(original, &target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
            *path = Some(target.display().to_string());
        }
    };
    for cluster in &mut kubeconfig.clusters {
        if let Some(cluster) = cluster.cluster.as_mut() {
            copy(&mut cluster.certificate_authority, "ca.crt");
        }
    }
    for user in &mut kubeconfig.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            copy(&mut auth.client_certificate, "admin.crt");
            let mut key = auth.client_key.clone();
            copy(&mut key, "admin.key");
            auth.client_key = key;
        }
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_vec(&kubeconfig).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}
