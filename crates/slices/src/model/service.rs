//! The cached Service: its ports, selector, address families and traffic distribution.

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{identity, text, token};
use crate::desired::Family;
use crate::text::{Intern, Labels, NoIntern, Text, Token};

/// A Service as the planner reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedService {
    /// Name.
    pub name: Text,
    /// Namespace.
    pub namespace: Text,
    /// Uid (our slices' owner reference points at it).
    pub uid: Option<Token>,
    /// resourceVersion (a re-list skips unchanged objects by it).
    pub resource_version: Option<Token>,
    /// The Service's own labels (copied onto its slices).
    pub labels: Labels,
    /// deletionTimestamp is set.
    pub deleting: bool,
    /// The selector, when the Service gets slices from us: `None` for ExternalName Services and
    /// for a missing or empty selector (see `labels::active_selector`).
    pub selector: Option<Labels>,
    /// clusterIP `None`.
    pub headless: bool,
    /// `publishNotReadyAddresses`.
    pub publish_not_ready: bool,
    /// The Service ports.
    pub ports: Box<[CachedServicePort]>,
    /// Families the slices may have (`ipFamilies`; none listed means both).
    pub families: Families,
    /// `trafficDistribution`, as it decides endpoint hints (docs/slices.md, "Topology hints").
    pub traffic_distribution: TrafficDistribution,
}

/// A Service's `spec.trafficDistribution`, as far as it decides the hints of its endpoints
/// (docs/slices.md, "Topology hints"). One byte in the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    /// No preference: the field is unset, holds a value this controller does not know, or the
    /// Service asks for the older topology-aware routing by annotation, which takes precedence
    /// upstream. Endpoints carry no hints.
    #[default]
    Any,
    /// `PreferSameZone`, or `PreferClose` (its deprecated name, which means the same): a ready
    /// endpoint with a zone is hinted for that zone.
    PreferSameZone,
    /// `PreferSameNode`: hints for the endpoint's node and zone; external workloads run on no
    /// node, so only the zone hint is written.
    PreferSameNode,
}

/// A Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedServicePort {
    /// Port name (`None` for unnamed).
    pub name: Option<Text>,
    /// Port number.
    pub port: i32,
    /// Protocol (`None` reads as TCP).
    pub protocol: Option<Text>,
    /// targetPort.
    pub target: TargetPort,
}

/// A Service port's targetPort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    /// Not set: the Service port's own number.
    Same,
    /// A number.
    Number(i32),
    /// A name, resolved against each workload's ports.
    Name(Text),
}

/// A set of address families (two bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Families {
    v4: bool,
    v6: bool,
}

// === impl Families ===

impl Families {
    /// Both families.
    pub const BOTH: Families = Families { v4: true, v6: true };

    /// Whether `family` is in the set.
    pub fn contains(self, family: Family) -> bool {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }

    /// The families of an `ipFamilies` list; none (or none known) means both.
    fn listed<'a>(list: impl IntoIterator<Item = &'a String>) -> Self {
        let mut families = Families {
            v4: false,
            v6: false,
        };
        for family in list.into_iter().filter_map(|f| Family::parse(f)) {
            match family {
                Family::V4 => families.v4 = true,
                Family::V6 => families.v6 = true,
            }
        }
        if families.v4 || families.v6 {
            families
        } else {
            Families::BOTH
        }
    }
}

// === impl TrafficDistribution ===

impl TrafficDistribution {
    /// The `trafficDistribution` values that ask for hints.
    const PREFER_CLOSE: &str = "PreferClose";
    const PREFER_SAME_ZONE: &str = "PreferSameZone";
    const PREFER_SAME_NODE: &str = "PreferSameNode";

    /// What `service` asks for. The topology-mode annotation (or its deprecated predecessor)
    /// set to `Auto` makes upstream ignore `trafficDistribution` in favour of its CPU-weighted
    /// heuristic, which needs Nodes in each zone and does not apply to external workloads: we
    /// then write no hints (docs/slices.md, "Topology hints").
    pub fn of(service: &Service) -> Self {
        let annotations = service.metadata.annotations.as_ref();
        let auto = [
            TOPOLOGY_MODE_ANNOTATION,
            DEPRECATED_TOPOLOGY_HINTS_ANNOTATION,
        ]
        .iter()
        .find_map(|key| annotations.and_then(|a| a.get(*key)))
        .is_some_and(|mode| mode == "Auto" || mode == "auto");
        if auto {
            return TrafficDistribution::Any;
        }
        let value = service
            .spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref());
        match value {
            Some(Self::PREFER_CLOSE | Self::PREFER_SAME_ZONE) => {
                TrafficDistribution::PreferSameZone
            }
            Some(Self::PREFER_SAME_NODE) => TrafficDistribution::PreferSameNode,
            _ => TrafficDistribution::Any,
        }
    }

    /// Whether ready endpoints with a zone are hinted for it.
    pub fn zone_hints(self) -> bool {
        !matches!(self, TrafficDistribution::Any)
    }
}

/// The annotation that turns on upstream's older topology-aware routing (`Auto`).
pub const TOPOLOGY_MODE_ANNOTATION: &str = "service.kubernetes.io/topology-mode";

/// The deprecated predecessor of [`TOPOLOGY_MODE_ANNOTATION`] (`auto`); upstream reads it first.
pub const DEPRECATED_TOPOLOGY_HINTS_ANNOTATION: &str = "service.kubernetes.io/topology-aware-hints";

// === impl CachedService ===

impl CachedService {
    /// The cached form of `service`.
    pub fn new(service: &Service, intern: &impl Intern) -> Self {
        let (name, namespace) = identity(&service.metadata, intern);
        let spec = service.spec.as_ref();
        let external_name = spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let selector = spec
            .and_then(|s| s.selector.as_ref())
            .filter(|s| !s.is_empty() && !external_name)
            .map(|s| Labels::from_map(Some(s), intern));
        let ports = spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .map(|p| CachedServicePort {
                name: text(p.name.as_ref(), intern),
                port: p.port,
                protocol: text(p.protocol.as_ref(), intern),
                target: match &p.target_port {
                    None => TargetPort::Same,
                    Some(IntOrString::Int(number)) => TargetPort::Number(*number),
                    Some(IntOrString::String(name)) => TargetPort::Name(intern.intern(name)),
                },
            })
            .collect();
        CachedService {
            name,
            namespace,
            uid: token(service.metadata.uid.as_ref()),
            resource_version: token(service.metadata.resource_version.as_ref()),
            labels: Labels::from_map(service.metadata.labels.as_ref(), intern),
            deleting: service.metadata.deletion_timestamp.is_some(),
            selector,
            headless: spec.and_then(|s| s.cluster_ip.as_deref()) == Some("None"),
            publish_not_ready: spec
                .and_then(|s| s.publish_not_ready_addresses)
                .unwrap_or(false),
            ports,
            families: Families::listed(
                spec.and_then(|s| s.ip_families.as_ref())
                    .into_iter()
                    .flatten(),
            ),
            traffic_distribution: TrafficDistribution::of(service),
        }
    }

    /// A reference to the Service, for Events about it.
    pub fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Service".to_owned()),
            name: Some(self.name.to_string()),
            namespace: Some(self.namespace.to_string()),
            uid: self.uid.as_ref().map(Token::to_string),
            resource_version: self.resource_version.as_ref().map(Token::to_string),
            field_path: None,
        }
    }
}

impl From<&Service> for CachedService {
    fn from(service: &Service) -> Self {
        CachedService::new(service, &NoIntern)
    }
}
