//! Fencing the API server enforces: the policy template and how to recognise its refusals.

/// Fencing the API server enforces, beside the writer's own [`Fence`](crate::Fence).
///
/// [`Fence::check`](crate::Fence::check) stops every write this process sends after it knows its
/// term is over. It cannot stop a process that was paused (SIGSTOP, a long pause of its node)
/// past its lease and wakes up mid-write, nor a request already on the wire when the term ended.
/// Kubernetes can refuse those itself: a ValidatingAdmissionPolicy may take the Lease as its
/// parameter object and compare `spec.holderIdentity` with the pod that sent the request (a
/// bound ServiceAccount token carries it in the user's `authentication.kubernetes.io/pod-name`
/// extra). This is such a policy and its binding.
///
/// For it to work the elector's identity must be the pod's name (the Downward API's
/// `metadata.name`, as `POD_NAME` or `HOSTNAME`), which is also what client-go and Linkerd's
/// controllers use, so one policy serves a Lease shared with them. A client without the
/// pod-name extra (a client certificate, a legacy token Secret) is compared by its user name.
///
/// Limits, stated plainly:
/// - The API server reads the Lease from its own watch cache: a write sent within that cache's
///   lag of a hand-over (tens of milliseconds) is judged against the previous holder, in both
///   directions (a deposed holder may pass, the new holder may be refused).
/// - Only objects the policy names are protected, and only writes by the user it matches.
/// - A released Lease (no holder) refuses every matched write; the runtime drains before it
///   releases, so its own drain is not refused.
///
/// A writer that meets such a refusal should count it as a fenced write and stop the pass
/// ([`is_fencing_policy_denial`], [`Fence::refused_by_api_server`](crate::Fence::refused_by_api_server)),
/// not retry it as an ordinary API error.
///
/// The policy and its binding, as YAML with upper-case placeholders to replace: `POLICY_NAME`,
/// `API_GROUP` and `OBJECTS` (the resources to protect, e.g. `discovery.k8s.io` and
/// `endpointslices`), `USER` (the controller's user, e.g.
/// `system:serviceaccount:NAMESPACE:ACCOUNT`), and `LEASE_NAMESPACE`/`LEASE_NAME`. Needs
/// Kubernetes 1.30 or later.
pub const FENCING_POLICY_TEMPLATE: &str = include_str!("../policy/fencing.yaml");

/// The words every denial of [`FENCING_POLICY_TEMPLATE`] contains; [`is_fencing_policy_denial`] looks for
/// them, so a copy of the policy must keep them in its message.
pub const FENCING_POLICY_DENIAL: &str = "is not the current holder of the leader-election Lease";

/// Whether `error` is the API server refusing a write because the sender does not hold the Lease
/// (a 403 whose message contains [`FENCING_POLICY_DENIAL`]), as opposed to any other refusal: a 403
/// from RBAC is a misconfiguration an operator must see, not a fenced write.
pub fn is_fencing_policy_denial(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => {
            status.code == 403 && status.message.contains(FENCING_POLICY_DENIAL)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn forbidden(message: &str) -> kube::Error {
        let mut status = Status::failure(message, "Forbidden");
        status.code = 403;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn tells_a_policy_denial_from_an_rbac_refusal() {
        let denied = forbidden(&format!(
            "admission webhook denied the request: ValidatingAdmissionPolicy 'fencing' with binding \
             'fencing' denied request: 'pod-1' {FENCING_POLICY_DENIAL} ns/lease"
        ));
        assert!(is_fencing_policy_denial(&denied));
        let rbac = forbidden(
            "endpointslices.discovery.k8s.io \"web-x\" is forbidden: User \"pod-1\" cannot update \
             resource \"endpointslices\"",
        );
        assert!(!is_fencing_policy_denial(&rbac));
    }

    #[test]
    fn template_keeps_the_denial_message() {
        assert!(FENCING_POLICY_TEMPLATE.contains(FENCING_POLICY_DENIAL));
    }
}
