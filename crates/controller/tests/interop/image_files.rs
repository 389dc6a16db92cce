//! The image's files and config against the Dockerfile (see `image.rs`): exactly what the
//! Dockerfile's final stage copies from its build stage, i.e. what `scripts/image-rootfs.sh`
//! stages, and that is what the binary needs; the binary carries no debug info.

use std::{collections::BTreeSet, path::Path};

use super::image::{BINARY_PATH, DEPLOYMENT, DOCKERFILE, image_or_skip};

/// The Dockerfile's final stage copies one folder from its build stage, which
/// `scripts/image-rootfs.sh` fills; the script's image holds exactly those files, and they are
/// what the binary needs; its config is the final stage's.
pub fn check_files() {
    let stage = FinalStage::parse(DOCKERFILE);
    assert_eq!(
        stage.copies,
        vec!["COPY --from=build /rootfs/ /".to_string()],
        "the final stage copies the staged folder and nothing else"
    );
    assert!(
        DOCKERFILE.contains(
            "scripts/image-rootfs.sh target/release/external-endpoints /rootfs /external-endpoints.debug"
        ),
        "the build stage stages the release binary with scripts/image-rootfs.sh"
    );
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
    let Some(image) = image_or_skip(true) else {
        return;
    };

    // The config is the final stage's.
    assert_eq!(image.user(), (65532, 65532));
    assert_eq!(stage.user.as_deref(), Some("65532:65532"));
    assert_eq!(image.command(), stage.entrypoint);
    assert_eq!(image.command(), vec![BINARY_PATH.to_string()]);
    let ports: BTreeSet<String> = image.config["ExposedPorts"]
        .as_object()
        .map(|ports| ports.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(
        ports,
        stage.exposed.iter().map(|p| format!("{p}/tcp")).collect()
    );
    let labels = image.labels();
    for key in &stage.labels {
        assert!(
            labels.get(key).is_some_and(|value| !value.is_empty()),
            "label {key} in {labels:?}"
        );
    }
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    eprintln!(
        "image {}: revision {}",
        image.reference, labels["org.opencontainers.image.revision"]
    );

    // The files: exactly the staged ones, which are the binary, what ldd names for it, and
    // the three /etc files.
    let dir = tempfile::tempdir().unwrap();
    let rootfs = image.unpack(&dir.path().join("bundle"));
    let in_image = files_under(&rootfs);
    let staged: BTreeSet<String> = image.staged_files.iter().cloned().collect();
    assert_eq!(in_image, staged, "the image holds the staged files");
    let binary = rootfs.join(BINARY_PATH.trim_start_matches('/'));
    let mut needed: BTreeSet<String> = shared_libraries(&binary).into_iter().collect();
    needed.extend(
        [
            BINARY_PATH,
            "/etc/passwd",
            "/etc/group",
            "/etc/ssl/certs/ca-certificates.crt",
        ]
        .map(str::to_string),
    );
    assert_eq!(
        in_image, needed,
        "the image holds what the binary needs, no more"
    );
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("nonroot:x:65532:65532:"))
    );

    // No debug info in the shipped binary; a link to the separate debug file instead.
    let sections = elf_sections(&std::fs::read(&binary).unwrap());
    // `.debug_gdb_scripts` is not debug info: a few bytes, loaded with the program, naming
    // rustc's pretty-printers for gdb.
    let debug: Vec<&String> = sections
        .iter()
        .filter(|s| s.starts_with(".debug") && *s != ".debug_gdb_scripts")
        .collect();
    assert!(debug.is_empty(), "debug sections shipped: {debug:?}");
    assert!(sections.iter().any(|s| s == ".gnu_debuglink"));
    assert!(sections.iter().any(|s| s == ".symtab"), "symbols kept");
    let size = std::fs::metadata(&binary).unwrap().len();
    eprintln!("binary in the image: {size} bytes; files: {in_image:?}");
}

/// What the Dockerfile's last stage says.
#[derive(Debug, Default)]
struct FinalStage {
    copies: Vec<String>,
    user: Option<String>,
    entrypoint: Vec<String>,
    exposed: Vec<String>,
    labels: Vec<String>,
}

impl FinalStage {
    /// Parses the instructions after the last `FROM` (joining `\` continuations).
    fn parse(dockerfile: &str) -> FinalStage {
        let joined = dockerfile.replace("\\\n", " ");
        let instructions: Vec<&str> = joined
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .collect();
        let last_from = instructions
            .iter()
            .rposition(|line| line.starts_with("FROM "))
            .unwrap();
        let mut stage = FinalStage::default();
        for line in &instructions[last_from + 1..] {
            let (keyword, rest) = line.split_once(' ').unwrap_or((line, ""));
            let rest = rest.trim();
            match keyword {
                "COPY" | "ADD" => stage
                    .copies
                    .push(line.split_whitespace().collect::<Vec<_>>().join(" ")),
                "USER" => stage.user = Some(rest.to_string()),
                "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest).unwrap(),
                "EXPOSE" => stage
                    .exposed
                    .extend(rest.split_whitespace().map(str::to_string)),
                "LABEL" => stage.labels.extend(label_keys(rest)),
                _ => {}
            }
        }
        stage
    }
}

/// The keys of a `LABEL k="v" k2="v 2"` instruction.
fn label_keys(text: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut rest = text.trim();
    while let Some((key, value)) = rest.split_once('=') {
        keys.push(key.trim().to_string());
        let value = value.trim_start();
        rest = match value.strip_prefix('"') {
            Some(quoted) => quoted.split_once('"').map_or("", |(_, after)| after),
            None => value.split_once(' ').map_or("", |(_, after)| after),
        }
        .trim_start();
    }
    keys
}

/// The regular files under `root`, as absolute paths inside it.
fn files_under(root: &Path) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                folders.push(entry.path());
            } else {
                let path = entry.path();
                let inside = path.strip_prefix(root).unwrap();
                files.insert(format!("/{}", inside.display()));
            }
        }
    }
    files
}

/// The files `ldd` names for `binary` (the dynamic loader included, the vDSO not).
fn shared_libraries(binary: &Path) -> Vec<String> {
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .unwrap();
    assert!(output.status.success(), "ldd {}", binary.display());
    String::from_utf8(output.stdout)
        .unwrap()
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
        .map(str::to_string)
        .collect()
}

/// The section names of a 64-bit little-endian ELF file.
fn elf_sections(elf: &[u8]) -> Vec<String> {
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!((elf[4], elf[5]), (2, 1), "64-bit little-endian");
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let (table, entry_size, count, names_index) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |index: usize| table + index * entry_size;
    let names = u64_at(header(names_index) + 0x18);
    (0..count)
        .map(|index| {
            let start = names + u32_at(header(index));
            let end = start + elf[start..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8_lossy(&elf[start..end]).into_owned()
        })
        .collect()
}
