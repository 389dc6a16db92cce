//! Coordinated Leader Election (KEP-4355) against a real kube-apiserver running the election
//! controller (`--feature-gates=CoordinatedLeaderElection=true`,
//! `--runtime-config=coordination.k8s.io/v1beta1=true`): the library's coordinated elector
//! in-process with chosen versions (rolling upgrade, hand-over, yield, fencing), and the
//! binary's `--coordinated-election` flag.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is the failure report

use std::{collections::BTreeSet, time::Duration};

use harness::{CONVERGE, Replica, eventually};
use k8s_openapi::{
    api::{
        authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
        coordination::{v1::Lease, v1beta1::LeaseCandidate},
        rbac::v1::{Role, RoleBinding},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use leadership::{
    CandidateConfig, ElectorHandle, ElectorMetrics, Fence, Fenced, LeaseConfig, LeaseElector,
    LeaseTimings, Term,
};
use testbed::Testbed;
use tokio::time::Instant;

/// The controller binary this target was built with.
const BINARY: harness::Binary = harness::Binary(env!("CARGO_BIN_EXE_external-endpoints"));

const LEASE: &str = "cle";

/// How long the election controller may take to name a holder: it pings candidates whose
/// renewTime is more than 5 s old and waits up to 5 s for answers, and re-checks every 5 s.
const ELECTED: Duration = Duration::from_secs(60);

/// A window longer than two of the election controller's 5 s re-checks, for what must NOT
/// happen (a newer candidate taking over): there is no event to wait for.
const QUIET: Duration = Duration::from_secs(12);

/// How long replicas of one version are watched at least for a swap of the Lease: many of the
/// election controller's reconciles (one per renewal, every 2 s) and of its 5 s re-checks.
const TIED: Duration = Duration::from_secs(20);

/// This binary's control plane, with Coordinated Leader Election on.
static PLANE: tokio::sync::OnceCell<Result<Testbed, String>> = tokio::sync::OnceCell::const_new();

/// None (after one line on stderr) when the binaries are missing outside CI.
async fn plane() -> Option<&'static Testbed> {
    if testbed::Binaries::discover().is_err() && !testbed::running_in_ci() {
        eprintln!("coordinated election tests skipped: run `bash testbed/build.sh`");
        return None;
    }
    let plane = PLANE
        .get_or_init(|| async {
            let options = testbed::Options::default().with_coordinated_leader_election();
            Testbed::start(options).await.map_err(|e| e.to_string())
        })
        .await;
    match plane {
        Ok(testbed) => Some(testbed),
        Err(error) => panic!("testbed: {error}"),
    }
}

/// A coordinated candidate `identity` of `version` (binary = emulation) for [`LEASE`].
fn candidate(client: &Client, namespace: &str, identity: &str, version: &str) -> ElectorHandle {
    counted_candidate(client, namespace, identity, version).0
}

/// [`candidate`], with the counters its elector updates (taken before spawning, as an app does).
fn counted_candidate(
    client: &Client,
    namespace: &str,
    identity: &str,
    version: &str,
) -> (ElectorHandle, ElectorMetrics) {
    let config = LeaseConfig::new(LEASE, namespace, identity, LeaseTimings::default()).unwrap();
    let versions = CandidateConfig::new(version, version).unwrap();
    let elector = LeaseElector::coordinated_for_client(client.clone(), config, versions);
    let metrics = elector.metrics();
    (elector.spawn(), metrics)
}

fn current(handle: &ElectorHandle) -> Option<Term> {
    handle.leadership().borrow().clone()
}

async fn wait_leading(handle: &ElectorHandle, what: &str) -> Term {
    let mut leadership = handle.leadership();
    let term = tokio::time::timeout(ELECTED, leadership.wait_for(Option::is_some))
        .await
        .unwrap_or_else(|_| panic!("{what} not leading within {ELECTED:?}"))
        .expect("elector alive");
    term.clone().unwrap()
}

fn fence(handle: &ElectorHandle, term: &Term) -> Fence {
    leadership::testing::fence(term.clone(), handle.leadership(), Duration::from_secs(1))
}

async fn lease(client: &Client, namespace: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(LEASE)
        .await
        .unwrap()
}

fn holder(lease: &Option<Lease>) -> Option<String> {
    lease.as_ref()?.spec.as_ref()?.holder_identity.clone()
}

fn preferred(lease: &Option<Lease>) -> Option<String> {
    lease.as_ref()?.spec.as_ref()?.preferred_holder.clone()
}

async fn lease_candidate(client: &Client, namespace: &str, name: &str) -> Option<LeaseCandidate> {
    Api::<LeaseCandidate>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .unwrap()
}

async fn wait_candidate(client: &Client, namespace: &str, name: &str) -> LeaseCandidate {
    eventually(&format!("LeaseCandidate {name}"), CONVERGE, || async {
        lease_candidate(client, namespace, name)
            .await
            .ok_or_else(|| "missing".to_string())
    })
    .await
}

/// `old` (1.0.0) leads, `new` (1.1.0) has published its candidate.
async fn old_leading_new_joined(
    client: &Client,
    namespace: &str,
) -> (ElectorHandle, Term, ElectorHandle) {
    let (old, term, (new, _)) = old_leading_new_counted(client, namespace).await;
    (old, term, new)
}

/// [`old_leading_new_joined`], with the counters of `new`'s elector.
async fn old_leading_new_counted(
    client: &Client,
    namespace: &str,
) -> (ElectorHandle, Term, (ElectorHandle, ElectorMetrics)) {
    let old = candidate(client, namespace, "old", "1.0.0");
    let term = wait_leading(&old, "old").await;
    let new = counted_candidate(client, namespace, "new", "1.1.0");
    wait_candidate(client, namespace, "new").await;
    (old, term, new)
}

#[tokio::test(flavor = "multi_thread")]
async fn older_version_keeps_leading_while_a_newer_one_joins() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let client = plane.client().await.unwrap();
    let namespace = plane.fresh_namespace("cle-upgrade").await.unwrap();
    let (old, term, new) = old_leading_new_joined(&client, &namespace).await;

    let published = lease_candidate(&client, &namespace, "old").await.unwrap();
    assert_eq!(published.spec.lease_name, LEASE);
    assert_eq!(published.spec.binary_version, "1.0.0");
    assert_eq!(published.spec.emulation_version.as_deref(), Some("1.0.0"));
    assert_eq!(published.spec.strategy, "OldestEmulationVersion");

    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        let record = lease(&client, &namespace).await;
        assert_eq!(holder(&record).as_deref(), Some("old"));
        assert_eq!(preferred(&record), None, "the newer one is not preferred");
        assert_eq!(
            current(&old),
            Some(term.clone()),
            "the old one keeps its term"
        );
        assert!(current(&new).is_none(), "the newer one must not lead");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    new.release().await.unwrap();
    old.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn newer_version_leads_after_the_older_one_leaves_gracefully() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let client = plane.client().await.unwrap();
    let namespace = plane.fresh_namespace("cle-handover").await.unwrap();
    let (old, term, new) = old_leading_new_joined(&client, &namespace).await;
    let old_fence = fence(&old, &term);

    let started = Instant::now();
    old.release().await.unwrap();
    assert_eq!(
        old_fence.check(),
        Err(Fenced::TermEnded { term: term.id() })
    );
    assert!(lease_candidate(&client, &namespace, "old").await.is_none());
    let new_term = wait_leading(&new, "new").await;
    eprintln!(
        "hand-over: the new version leads {:?} after the old one started releasing",
        started.elapsed()
    );
    assert_eq!(
        holder(&lease(&client, &namespace).await).as_deref(),
        Some("new")
    );
    assert!(fence(&new, &new_term).check().is_ok());
    new.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn newer_leader_yields_when_an_older_version_joins() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let client = plane.client().await.unwrap();
    let namespace = plane.fresh_namespace("cle-rollback").await.unwrap();
    let new = candidate(&client, &namespace, "new", "1.1.0");
    let new_term = wait_leading(&new, "new").await;
    let new_fence = fence(&new, &new_term);

    // A rollback: the election controller prefers the older version and marks new's term.
    let old = candidate(&client, &namespace, "old", "1.0.0");
    let started = Instant::now();
    wait_leading(&old, "old").await;
    eprintln!(
        "yield: the older version leads {:?} after joining",
        started.elapsed()
    );
    assert!(current(&new).is_none(), "both lead");
    assert_eq!(
        new_fence.check(),
        Err(Fenced::TermEnded {
            term: new_term.id()
        })
    );
    let record = lease(&client, &namespace).await;
    assert_eq!(holder(&record).as_deref(), Some("old"));
    assert_eq!(preferred(&record), None);
    old.release().await.unwrap();
    new.release().await.unwrap();
}

fn transitions(lease: &Option<Lease>) -> Option<i32> {
    lease.as_ref()?.spec.as_ref()?.lease_transitions
}

/// Waits for the start of the next wall-clock second (plus a little), so that what is created
/// right after shares one `creationTimestamp` second.
async fn early_in_a_second() {
    let into = Timestamp::now().subsec_nanosecond();
    let rest = Duration::from_nanos((1_000_000_000 - into) as u64);
    tokio::time::sleep(rest + Duration::from_millis(20)).await;
}

/// Issue 27: the election controller orders candidates of equal versions by `creationTimestamp`
/// (seconds) and breaks a tie at random in each reconcile, setting `preferredHolder` to another
/// replica; yielding to each such preference swapped the Lease again and again. The holder now
/// declines a preference that does not follow from the versions.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_of_one_version_started_together_keep_the_first_holder() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let client = plane.client().await.unwrap();
    let namespace = plane.fresh_namespace("cle-tie").await.unwrap();
    early_in_a_second().await;
    let names = ["tie-a", "tie-b", "tie-c"];
    let counted = names.map(|name| counted_candidate(&client, &namespace, name, "1.0.0"));
    let metrics = counted.each_ref().map(|(_, metrics)| metrics.clone());
    let replicas = counted.map(|(handle, _)| handle);
    let mut created = BTreeSet::new();
    for name in names {
        let published = wait_candidate(&client, &namespace, name).await;
        let at = published.metadata.creation_timestamp.unwrap().0;
        created.insert(at.as_second());
    }

    let (leader, term) = eventually("one replica leads", ELECTED, || async {
        let leading = replicas
            .iter()
            .enumerate()
            .find_map(|(index, replica)| current(replica).map(|term| (index, term)));
        match leading {
            Some(leading) => Ok(leading),
            None => Err(format!(
                "holder {:?}",
                holder(&lease(&client, &namespace).await)
            )),
        }
    })
    .await;
    let first = lease(&client, &namespace).await;
    assert_eq!(holder(&first).as_deref(), Some(names[leader]));
    let first_transitions = transitions(&first);

    // At least TIED, and until the controller has preferred another replica once (else the tie
    // was not exercised), within ELECTED more.
    let mut preferred_others = BTreeSet::new();
    let watched_from = Instant::now();
    let (quiet_until, deadline) = (watched_from + TIED, watched_from + TIED + ELECTED);
    let declined = || metrics[leader].preferences_declined();
    while Instant::now() < quiet_until || declined() == 0 {
        assert!(
            Instant::now() < deadline,
            "the election controller never preferred another replica: the tie was not exercised"
        );
        let record = lease(&client, &namespace).await;
        assert_eq!(
            holder(&record).as_deref(),
            Some(names[leader]),
            "the Lease moved"
        );
        assert_eq!(transitions(&record), first_transitions, "a new term began");
        assert_eq!(
            current(&replicas[leader]),
            Some(term.clone()),
            "the term ended"
        );
        for (index, replica) in replicas.iter().enumerate() {
            assert!(index == leader || current(replica).is_none(), "two lead");
        }
        if let Some(other) = preferred(&record).filter(|other| other != names[leader]) {
            preferred_others.insert(other);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every term any of them began: the leader's one.
    let acquisitions: u64 = metrics.iter().map(ElectorMetrics::acquisitions).sum();
    assert_eq!(acquisitions, 1, "terms begun by the three");
    eprintln!(
        "tie: candidates created in {} distinct second(s); over {:?} {} kept the Lease; the \
         election controller preferred {preferred_others:?} (seen by polling), the holder \
         declined {} preference(s)",
        created.len(),
        watched_from.elapsed(),
        names[leader],
        declined(),
    );
    for replica in replicas {
        replica.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_whose_lease_names_another_stops_at_once_and_fences() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let client = plane.client().await.unwrap();
    let namespace = plane.fresh_namespace("cle-fence").await.unwrap();
    let (old, term, (new, new_metrics)) = old_leading_new_counted(&client, &namespace).await;
    let old_fence = fence(&old, &term);

    // The Lease moves to `new` as the election controller moves an expired one: holder
    // replaced, short duration, no acquireTime.
    let api = Api::<Lease>::namespaced(client.clone(), &namespace);
    let mut moved = api.get(LEASE).await.unwrap();
    let spec = moved.spec.as_mut().unwrap();
    spec.holder_identity = Some("new".into());
    spec.preferred_holder = None;
    spec.lease_duration_seconds = Some(5);
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    spec.acquire_time = None;
    api.replace(LEASE, &PostParams::default(), &moved)
        .await
        .unwrap();

    let mut leadership = old.leadership();
    tokio::time::timeout(Duration::from_secs(5), leadership.wait_for(Option::is_none))
        .await
        .expect("the old leader stops at once (watch), not after RenewDeadline")
        .unwrap();
    assert_eq!(
        old_fence.check(),
        Err(Fenced::TermEnded { term: term.id() })
    );

    // The controller still prefers the older version: `new` leads only until it yields, then
    // `old` leads again under a new term; the first term's fence stays closed.
    let again = eventually("old leads again", ELECTED, || async {
        match current(&old) {
            Some(term) => Ok(term),
            None => Err(format!(
                "holder {:?}",
                holder(&lease(&client, &namespace).await)
            )),
        }
    })
    .await;
    assert!(again.id() > term.id());
    assert!(current(&new).is_none(), "both lead");
    assert_eq!(
        old_fence.check(),
        Err(Fenced::TermEnded { term: term.id() })
    );
    // Whether `new` renewed (and so led) before the election controller moved the Lease back is
    // the API server's timing, not ours: reported, not asserted.
    eprintln!(
        "new acquired {} term(s) before yielding",
        new_metrics.acquisitions()
    );
    new.release().await.unwrap();
    old.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_flag_publishes_its_candidate_and_leads_when_elected() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let namespace = plane.fresh_namespace("cle-binary").await.unwrap();
    let client = plane.client().await.unwrap();
    let mut replica = Replica::start(
        BINARY,
        plane,
        &namespace,
        "replica-a",
        &["--coordinated-election"],
    )
    .await;
    replica.wait_leading(ELECTED).await;
    let published = lease_candidate(&client, &namespace, "replica-a")
        .await
        .expect("LeaseCandidate of the replica");
    assert_eq!(published.spec.lease_name, harness::LEASE);
    assert_eq!(published.spec.binary_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        published.spec.emulation_version.as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );

    replica.terminate();
    assert!(replica.wait_exit(CONVERGE).await.success());
    assert!(
        lease_candidate(&client, &namespace, "replica-a")
            .await
            .is_none(),
        "the candidate is deleted on graceful shutdown"
    );
    let record = Api::<Lease>::namespaced(client, &namespace)
        .get(harness::LEASE)
        .await
        .unwrap();
    assert_eq!(
        record.spec.unwrap().holder_identity.as_deref(),
        Some(""),
        "released"
    );
}

/// The Role and RoleBinding of `deploy/rbac.yaml` for the Lease, moved into `namespace`.
fn lease_rbac_in(namespace: &str) -> (Role, RoleBinding) {
    use k8s_openapi::serde::Deserialize;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut role = None;
    let mut binding = None;
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).unwrap();
        match value["kind"].as_str() {
            Some("Role") => role = Some(serde_yaml::from_value::<Role>(value).unwrap()),
            Some("RoleBinding") => {
                binding = Some(serde_yaml::from_value::<RoleBinding>(value).unwrap());
            }
            _ => {}
        }
    }
    let (mut role, mut binding) = (role.unwrap(), binding.unwrap());
    role.metadata.namespace = Some(namespace.into());
    binding.metadata.namespace = Some(namespace.into());
    for subject in binding.subjects.iter_mut().flatten() {
        subject.namespace = Some(namespace.into());
    }
    (role, binding)
}

async fn allowed(client: &Client, user: &str, namespace: &str, verb: &str) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                group: Some("coordination.k8s.io".into()),
                resource: Some("leasecandidates".into()),
                namespace: Some(namespace.into()),
                verb: Some(verb.into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|status| status.allowed)
}

#[tokio::test(flavor = "multi_thread")]
async fn deployed_rbac_allows_lease_candidates_in_the_lease_namespace_only() {
    let Some(plane) = plane().await else { return };
    let _logs = plane.log_guard();
    let client = plane.client().await.unwrap();
    let home = plane.fresh_namespace("cle-rbac").await.unwrap();
    let elsewhere = plane.fresh_namespace("cle-rbac-other").await.unwrap();
    let (role, binding) = lease_rbac_in(&home);
    let account = binding.subjects.as_ref().unwrap()[0].name.clone();
    Api::<Role>::namespaced(client.clone(), &home)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), &home)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let user = format!("system:serviceaccount:{home}:{account}");
    for verb in ["get", "list", "watch", "create", "update", "delete"] {
        eventually(&format!("{verb} leasecandidates"), CONVERGE, || async {
            if allowed(&client, &user, &home, verb).await {
                Ok(())
            } else {
                Err("denied".to_string())
            }
        })
        .await;

        assert!(
            !allowed(&client, &user, &elsewhere, verb).await,
            "{verb} allowed outside the lease namespace"
        );
    }
}
