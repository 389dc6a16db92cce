//! The certificates and keys of one control plane, generated at start-up.
//!
//! ```text
//!  ca ──signs──► serving   (kube-apiserver; SANs 127.0.0.1, ::1, localhost)
//!     ├─signs──► admin     (client; CN admin, O system:masters: RBAC superuser)
//!     └─signs──► <user>    (client, on demand: [`write_client_cert`]; CN <user>, O system:masters)
//!  sa key pair              (signs and verifies service-account tokens)
//! ```
//! Every key is ECDSA P-256: `ring` can generate it (it cannot generate RSA), and both Go's
//! TLS stack and kube-apiserver's token signer (ES256) accept it.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::TestbedError;

/// Paths of the PEM files written by [`write_pki`].
#[derive(Clone, Debug)]
pub(crate) struct Pki {
    pub ca_cert: PathBuf,
    /// The CA's key: more client certificates are signed on demand ([`write_client_cert`]).
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub sa_public: PathBuf,
    pub sa_private: PathBuf,
}

/// Generates a fresh CA, serving and admin certificates and a service-account key pair into
/// `dir` (private keys readable by the owner only).
pub(crate) fn write_pki(dir: &Path) -> Result<Pki, TestbedError> {
    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_cert: dir.join("serving.crt"),
        serving_key: dir.join("serving.key"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_public: dir.join("sa.pub"),
        sa_private: dir.join("sa.key"),
    };

    let ca_params = ca_params()?;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    write(&pki.ca_key, &ca_key.serialize_pem(), true)?;
    let ca = Issuer::new(ca_params, ca_key);
    write(&pki.ca_cert, &ca_cert.pem(), false)?;

    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "localhost".to_string(),
    ])?;
    serving.distinguished_name = name("kube-apiserver", None);
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate()?;
    write(
        &pki.serving_cert,
        &serving.signed_by(&serving_key, &ca)?.pem(),
        false,
    )?;
    write(&pki.serving_key, &serving_key.serialize_pem(), true)?;

    sign_client(&ca, "admin", (&pki.admin_cert, &pki.admin_key))?;

    let sa_key = KeyPair::generate()?;
    write(&pki.sa_public, &sa_key.public_key_pem(), false)?;
    write(&pki.sa_private, &sa_key.serialize_pem(), true)?;

    Ok(pki)
}

/// Signs a client certificate for `user` (CN `user`, O `system:masters`: an RBAC superuser
/// whom the API server's audit log names `user`) with the CA of `pki`, into `cert` and `key`.
pub(crate) fn write_client_cert(
    pki: &Pki,
    user: &str,
    (cert, key): (&Path, &Path),
) -> Result<(), TestbedError> {
    let pem = std::fs::read_to_string(&pki.ca_key).map_err(TestbedError::io(format!(
        "reading {}",
        pki.ca_key.display()
    )))?;
    // The same subject and key as the CA certificate: what a certificate it signs must name.
    let ca = Issuer::new(ca_params()?, KeyPair::from_pem(&pem)?);
    sign_client(&ca, user, (cert, key))
}

/// The CA certificate's parameters (its key is generated apart).
fn ca_params() -> Result<CertificateParams, TestbedError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name("external-endpoints-testbed-ca", None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// A client certificate of `user` in group `system:masters`, signed by `ca`.
fn sign_client(
    ca: &Issuer<'_, KeyPair>,
    user: &str,
    (cert, key): (&Path, &Path),
) -> Result<(), TestbedError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(user, Some("system:masters"));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key_pair = KeyPair::generate()?;
    write(cert, &params.signed_by(&key_pair, ca)?.pem(), false)?;
    write(key, &key_pair.serialize_pem(), true)
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name
}

fn write(path: &Path, contents: &str, private: bool) -> Result<(), TestbedError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if private { 0o600 } else { 0o644 };
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .and_then(|mut file| file.write_all(contents.as_bytes()))
        .map_err(TestbedError::io(format!("writing {}", path.display())))
}
