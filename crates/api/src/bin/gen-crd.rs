//! Writes the ExternalWorkload CRD to `deploy/crds/externalworkloads.yaml`
//! (or to standard output with `--stdout`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let yaml = api::crd_yaml()?;
    if std::env::args().any(|arg| arg == "--stdout") {
        print!("{yaml}");
        return Ok(());
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(api::crd::CRD_PATH);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, yaml)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
