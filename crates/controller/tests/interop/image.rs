//! The container image, built by `scripts/image.sh` (no registry: the Dockerfile's final stage,
//! built by buildah from files staged by `scripts/image-rootfs.sh`), checked two ways:
//!
//! - `image_files::check_files`: the image holds exactly what the Dockerfile's final stage copies from its
//!   build stage, which is what `scripts/image-rootfs.sh` stages: the binary without debug info,
//!   the libraries `ldd` names for it, `/etc/passwd`, `/etc/group`, the CA bundle; and its config
//!   (user, entrypoint, port, labels) is the final stage's.
//! - [`run`]: the image runs as operators run it: unpacked with umoci, run with runc as uid 65532
//!   with a read-only root and no capabilities against the testbed, it syncs, leads, writes
//!   slices and answers on its admin port; a second container follows, and on SIGTERM the first
//!   drains, releases the Lease, exits 0, and the second takes over and writes.
//!
//! Without the image, runc or umoci (or root), both say so and pass, unless CI=true, where they
//! fail: `.ci/run` installs the tools and builds the image first.

use std::{
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use kube::config::Kubeconfig;
use slices::testing;

use super::{
    contender::SHORT,
    oci::{self, CONFIG_MOUNT, Container, Image},
};
use harness::{CONVERGE, Cluster, eventually, http_get, sum_metric};

pub const DOCKERFILE: &str = include_str!("../../../../Dockerfile");
pub const DEPLOYMENT: &str = include_str!("../../../../deploy/deployment.yaml");

/// The path of the binary in the image.
pub const BINARY_PATH: &str = "/usr/local/bin/external-endpoints";

/// The image, or `None` after a notice when it (or the runtime) is missing outside CI.
pub fn image_or_skip(needs_runtime: bool) -> Option<Image> {
    let missing = match Image::find() {
        None => Some(format!(
            "no image in {} (run `bash scripts/image.sh`)",
            Image::out_dir().display()
        )),
        Some(image) => match oci::missing_runtime().filter(|_| needs_runtime) {
            None => return Some(image),
            Some(reason) => Some(reason),
        },
    };
    let reason = missing.unwrap_or_default();
    assert!(!testbed::running_in_ci(), "image test under CI: {reason}");
    // Straight to stderr: libtest captures eprintln!, and a skip must show in a passing run.
    let _ = writeln!(std::io::stderr(), "image test skipped: {reason}");
    None
}

// === the containers ===

/// Two containers of the image on one Lease: the first leads and writes, the second follows;
/// SIGTERM to the first: it drains, releases, exits 0, and the second leads and writes.
pub async fn run(testbed: &'static testbed::Testbed) {
    let Some(image) = image_or_skip(true) else {
        return;
    };
    let cluster = Cluster::new(testbed, "interop-image").await;
    let dir = tempfile::tempdir().unwrap();
    oci::open_dir(dir.path());
    let rootfs = image.unpack(&dir.path().join("image"));
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    oci::open_dir(&config_dir);
    container_kubeconfig(testbed, &config_dir);

    let mut a = start(
        &image,
        &rootfs,
        &config_dir,
        dir.path(),
        "image-a",
        &cluster,
    );
    let admin_a = admin_address(&a).await;
    check_isolation(&a);
    let (status, body) = http_get(admin_a, "/live").await.unwrap();
    assert_eq!(status, 200, "/live: {body}");
    eventually("/ready (caches synced)", CONVERGE, || async {
        match http_get(admin_a, "/ready").await? {
            (200, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        }
    })
    .await;
    wait_leader(&a, admin_a, 1.0).await;
    cluster.create_service(testing::web()).await;
    cluster
        .apply_workload(testing::vm("vm-1", "10.0.0.1"))
        .await;
    cluster.wait_converged().await;
    assert_eq!(cluster.slices_of("web").await.len(), 1);
    let (_, metrics) = http_get(admin_a, "/metrics").await.unwrap();
    let creates = sum_metric(&metrics, "external_endpoints_slice_writes_total", "Create");
    assert!(creates >= Some(1.0), "slice creates {creates:?}");
    assert_eq!(holder(&cluster).await.as_deref(), Some("image-a"));

    // A second container: ready, following.
    let mut b = start(
        &image,
        &rootfs,
        &config_dir,
        dir.path(),
        "image-b",
        &cluster,
    );
    let admin_b = admin_address(&b).await;
    eventually("image-b ready", CONVERGE, || async {
        match http_get(admin_b, "/ready").await? {
            (200, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        }
    })
    .await;
    wait_leader(&b, admin_b, 0.0).await;

    // SIGTERM to the leader's container: it drains, releases, exits 0; b takes over.
    a.signal("TERM");
    let exit = a.wait_exit(CONVERGE).await;
    assert!(exit.success(), "image-a exited {exit:?}; log:\n{}", a.log());
    let log = a.log();
    assert!(log.contains("draining before releasing the lease"), "{log}");
    assert!(log.contains("released the lease"), "{log}");
    // Released, not left to expire: right after the exit the Lease no longer names image-a
    // (it would for 9 s after its last renewal otherwise).
    let after_exit = holder(&cluster).await;
    assert_ne!(
        after_exit.as_deref(),
        Some("image-a"),
        "the Lease was not released"
    );
    wait_leader(&b, admin_b, 1.0).await;
    assert_eq!(holder(&cluster).await.as_deref(), Some("image-b"));
    cluster
        .apply_workload(testing::vm("vm-2", "10.0.0.2"))
        .await;
    cluster.wait_converged().await;
    let endpoints = cluster.endpoints_of("web").await;
    assert_eq!(endpoints.len(), 2, "{endpoints:?}");

    b.signal("TERM");
    let exit = b.wait_exit(CONVERGE).await;
    assert!(exit.success(), "image-b exited {exit:?}; log:\n{}", b.log());
    assert_eq!(holder(&cluster).await, None, "image-b released");
}

/// The Lease the Deployment's arguments name.
const LEASE_NAME: &str = "external-endpoints-write";

/// Its holder (None when released).
async fn holder(cluster: &Cluster) -> Option<String> {
    let lease = cluster.leases().get_opt(LEASE_NAME).await.unwrap()?;
    lease
        .spec?
        .holder_identity
        .filter(|holder| !holder.is_empty())
}

/// Starts a container of `image` named `id`, on the Lease of `cluster`'s namespace, with the
/// Deployment's arguments (admin on 127.0.0.1:0 here: the host's network is shared) and its
/// downward-API environment.
fn start(
    image: &Image,
    rootfs: &Path,
    config_dir: &Path,
    dir: &Path,
    id: &str,
    cluster: &Cluster,
) -> Container {
    let mut args: Vec<String> = [
        "--admin-addr=127.0.0.1:0",
        "--drain-timeout=10s",
        "--log-format=json",
    ]
    .map(str::to_string)
    .to_vec();
    args.push(format!("--lease-name={LEASE_NAME}"));
    args.push(format!("--kubeconfig={CONFIG_MOUNT}/kubeconfig"));
    args.push(format!("--watch-namespace={}", cluster.namespace));
    args.extend(SHORT.our_args());
    let env = [
        format!("POD_NAME={id}"),
        format!("POD_NAMESPACE={}", cluster.namespace),
    ];
    let spec = image.runtime_spec(rootfs, id, config_dir, &args, &env);
    // runc's container ids (and cgroups) are machine-wide: the test's namespace makes them
    // unique.
    Container::run(dir, &format!("{}-{id}", cluster.namespace), &spec)
}

/// The admin address the controller logs at start-up.
async fn admin_address(container: &Container) -> SocketAddr {
    eventually("the admin address", CONVERGE, || async {
        let log = container.log();
        log.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find_map(|entry| entry.get("admin")?.as_str()?.parse().ok())
            .ok_or_else(|| format!("log so far:\n{log}"))
    })
    .await
}

async fn wait_leader(container: &Container, admin: SocketAddr, value: f64) {
    eventually(
        &format!("{} leader = {value}", container.id),
        CONVERGE,
        || async {
            let (_, body) = http_get(admin, "/metrics").await?;
            match sum_metric(&body, "external_endpoints_leader", "") {
                Some(found) if found == value => Ok(()),
                other => Err(format!("leader {other:?}")),
            }
        },
    )
    .await;
}

/// The controller runs as 65532 with no capabilities, no new privileges and a read-only root.
fn check_isolation(container: &Container) {
    let (status, pid) = container.state().unwrap();
    assert_eq!(status, "running");
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        proc_status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(
        field("Uid:").iter().all(|id| id == "65532"),
        "{:?}",
        field("Uid:")
    );
    assert!(
        field("Gid:").iter().all(|id| id == "65532"),
        "{:?}",
        field("Gid:")
    );
    assert!(field("Groups:").is_empty());
    assert_eq!(field("CapEff:"), ["0000000000000000"]);
    assert_eq!(field("CapBnd:"), ["0000000000000000"]);
    assert_eq!(field("NoNewPrivs:"), ["1"]);
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
    // Its own pid namespace (it is pid 1 there), the host's network namespace.
    let namespace =
        |pid: &str, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    let pid = pid.to_string();
    assert_ne!(namespace(&pid, "pid"), namespace("self", "pid"));
    assert_eq!(namespace(&pid, "net"), namespace("self", "net"));
}

/// The testbed's kubeconfig and the PEM files it names, copied into `dir` (readable by 65532),
/// with the paths the container sees under [`CONFIG_MOUNT`].
fn container_kubeconfig(testbed: &testbed::Testbed, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut kubeconfig = Kubeconfig::read_from(testbed.kubeconfig_path()).unwrap();
    let copy = |path: &mut Option<String>, name: &str| {
        if let Some(original) = path.as_ref() {
            let target: PathBuf = dir.join(name);
            std::fs::copy(original, &target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
            *path = Some(format!("{CONFIG_MOUNT}/{name}"));
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
}
