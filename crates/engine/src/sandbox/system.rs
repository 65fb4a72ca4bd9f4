//! The system's secrets, kept from every confined step: `/etc`'s secret entries
//! (`shadow`, `sudoers`, SSH host keys, `ssl/private`, …). Two ways, by what the kernel
//! allows steward:
//!
//! - **Masked** ([`masks`]), where a step gets a mount namespace of its own (root): each
//!   secret file has `/dev/null` mounted over it and each secret folder an empty,
//!   read-only tmpfs, in the step's namespace only. Landlock forbids the confined step to
//!   unmount them. This is the way for root, whom file permissions do not stop.
//! - **Fenced** ([`layer`]), elsewhere: a second Landlock layer that allows everything
//!   except the secrets. Landlock rules only allow, and a rule on a folder covers all
//!   beneath it, so the layer grants every top-level folder but `/etc`, and `/etc`'s
//!   entries one by one, leaving the secrets out (going one level down where a secret sits
//!   deeper). Stacked on a step's own ruleset (which may read all of `/etc`), what is
//!   allowed is what both allow. (It cannot serve beside a private `/tmp`: Landlock does
//!   not see a folder's rules through a mount over it.)
//!
//! Both are computed once and kept; they are renewed when `/`, `/etc` or a folder of it
//! that holds secrets changes (a rule holds an inode, so a file replaced by rename needs a
//! fresh one).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, ABI,
};

/// Entries of `/etc` (relative paths) no step may read.
pub const SECRETS: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "security/opasswd",
    "ssl/private",
    "krb5.keytab",
    "credstore",
    "credstore.encrypted",
    "wireguard",
    "ppp/chap-secrets",
    "ppp/pap-secrets",
    "NetworkManager/system-connections",
    "libvirt/secrets",
    ".pwd.lock",
];

/// Whether `/etc/<rel>` is a secret: listed, or an SSH host key (`ssh/ssh_host_*_key`).
fn secret(rel: &str) -> bool {
    SECRETS.contains(&rel)
        || rel
            .strip_prefix("ssh/ssh_host_")
            .is_some_and(|k| k.ends_with("_key"))
}

/// Whether a secret sits beneath `/etc/<rel>` (so it is granted entry by entry).
fn holds_secret(rel: &str) -> bool {
    rel == "ssh"
        || SECRETS
            .iter()
            .any(|s| s.strip_prefix(rel).is_some_and(|r| r.starts_with('/')))
}

/// What the layer grants: every entry of `/` but `/etc`, and `/etc`'s minus the secrets.
pub fn granted(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in read_dir(root) {
        if entry.file_name().is_some_and(|n| n == "etc") {
            grant_etc(&entry, "", &mut out);
        } else {
            out.push(entry);
        }
    }
    out
}

fn grant_etc(dir: &Path, rel: &str, out: &mut Vec<PathBuf>) {
    for entry in read_dir(dir) {
        let name = entry.file_name().unwrap_or_default().to_string_lossy();
        let rel = if rel.is_empty() {
            name.into_owned()
        } else {
            format!("{rel}/{name}")
        };
        if secret(&rel) {
            continue;
        }
        if holds_secret(&rel) && entry.is_dir() {
            grant_etc(&entry, &rel, out);
        } else {
            out.push(entry);
        }
    }
}

fn read_dir(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// A secret to mask in a step's mount namespace: its path and whether it is a folder.
pub struct Mask {
    pub path: std::ffi::CString,
    pub folder: bool,
}

/// The secrets of `/etc` that exist, to mask (kept for the daemon's life, renewed when
/// `/etc` changes; a renewed list is leaked, once per change, so a step being spawned
/// never loses its pointer).
pub fn masks() -> &'static [Mask] {
    static KEPT: Mutex<Option<(Stamp, &'static [Mask])>> = Mutex::new(None);
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let now = changed();
    match &*kept {
        Some((at, list)) if *at == now => list,
        _ => {
            let list: &'static [Mask] =
                Box::leak(existing_secrets(Path::new("/etc")).into_boxed_slice());
            *kept = Some((now, list));
            list
        }
    }
}

fn existing_secrets(etc: &Path) -> Vec<Mask> {
    let mut paths: Vec<PathBuf> = SECRETS.iter().map(|s| etc.join(s)).collect();
    paths.extend(read_dir(&etc.join("ssh")).into_iter().filter(|p| {
        p.file_name()
            .map(|n| n.to_string_lossy())
            .is_some_and(|n| secret(&format!("ssh/{n}")))
    }));
    paths
        .into_iter()
        .filter_map(|p| {
            let meta = std::fs::symlink_metadata(&p).ok()?;
            if meta.file_type().is_symlink() {
                return None;
            }
            Some(Mask {
                path: std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).ok()?,
                folder: meta.is_dir(),
            })
        })
        .collect()
}

/// When `/`, `/etc` and the folders of `/etc` that hold secrets last changed: what the
/// kept lists and layer were made from.
type Stamp = Vec<Option<SystemTime>>;

fn changed() -> Stamp {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let etc = Path::new("/etc");
    // A new SSH host key changes /etc/ssh, not /etc.
    let nested = SECRETS
        .iter()
        .filter_map(|s| s.split_once('/').map(|(folder, _)| folder))
        .chain(["ssh"]);
    [m(Path::new("/")), m(etc)]
        .into_iter()
        .chain(nested.map(|folder| m(&etc.join(folder))))
        .collect()
}

type Built = (Stamp, OwnedFd);

/// The layer's ruleset descriptor for Landlock ABI `abi` (kept open for every step), or
/// None when it cannot be built.
pub fn layer(abi: i32) -> Option<RawFd> {
    static BUILT: Mutex<Option<Built>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let now = changed();
    if built.as_ref().is_none_or(|(at, _)| *at != now) {
        *built = build(abi).map(|fd| (now, fd));
    }
    built.as_ref().map(|(_, fd)| fd.as_raw_fd())
}

fn build(abi: i32) -> Option<OwnedFd> {
    let abi = ABI::from(abi);
    let created = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .ok()?
        .create()
        .ok()?
        .add_rules(path_beneath_rules(
            granted(Path::new("/")),
            AccessFs::from_all(abi),
        ))
        .ok()?;
    created.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_left_out_and_their_neighbours_granted() {
        let root = tempfile::tempdir().unwrap();
        for f in [
            "etc/passwd",
            "etc/shadow",
            "etc/ssh/sshd_config",
            "etc/ssh/ssh_host_ed25519_key",
            "etc/ssh/ssh_host_ed25519_key.pub",
            "etc/ssl/certs/ca.pem",
            "etc/ssl/private/server.key",
            "usr/bin/true",
        ] {
            let p = root.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "").unwrap();
        }
        let rel: Vec<String> = granted(root.path())
            .iter()
            .map(|p| p.strip_prefix(root.path()).unwrap().display().to_string())
            .collect();
        let mut rel = rel;
        rel.sort();
        assert_eq!(
            rel,
            [
                "etc/passwd",
                "etc/ssh/ssh_host_ed25519_key.pub",
                "etc/ssh/sshd_config",
                "etc/ssl/certs",
                "usr"
            ]
        );
    }
}
