//! `[sandbox]`: what a workflow's maker and checker may touch (see [`crate::sandbox`]).
//! The table in `steward.toml` is every workflow's default; a workflow's own table
//! overrides `enabled`, `net` and `require`, and adds to `read` and `write`.
//!
//! ```toml
//! [sandbox]
//! read = ["data"]          # beneath the config folder, or absolute
//! write = []               # besides the run's scratch folder (always writable)
//! net = ["tcp:443"]        # or "any", or "none" (the default)
//! require = false          # true: refuse to run where the kernel cannot enforce it all
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sandbox::{Net, Policy};

/// A `[sandbox]` table as written (every key optional, so tables can be layered).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSettings {
    /// On (the default): the maker and checker run confined. Off only where a step
    /// really needs the whole machine; the run record then says `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require: Option<bool>,
}

/// `net = "none" | "any" | ["tcp:PORT", …]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "serde_json::Value")]
pub struct NetSetting(pub Net);

impl From<NetSetting> for serde_json::Value {
    fn from(n: NetSetting) -> Self {
        match n.0 {
            Net::None => "none".into(),
            Net::Any => "any".into(),
            Net::Ports(ports) => ports.iter().map(|p| format!("tcp:{p}")).collect(),
        }
    }
}

impl<'de> Deserialize<'de> for NetSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<String>),
        }
        let expected = "expected \"none\", \"any\" or a list of \"tcp:PORT\" entries (e.g. net = [\"tcp:443\"])";
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))? {
            Raw::Word(w) if w == "none" => Ok(NetSetting(Net::None)),
            Raw::Word(w) if w == "any" => Ok(NetSetting(Net::Any)),
            Raw::Word(w) => Err(serde::de::Error::custom(format!("net = {w:?}: {expected}"))),
            Raw::List(entries) => {
                let mut ports = Vec::new();
                for entry in entries {
                    let port = entry
                        .strip_prefix("tcp:")
                        .and_then(|p| p.parse::<u16>().ok())
                        .filter(|p| *p > 0);
                    match port {
                        Some(p) => ports.push(p),
                        // A metering model gateway in the daemon is planned; its entry
                        // will be "gateway".
                        None => {
                            return Err(serde::de::Error::custom(format!(
                                "net entry {entry:?}: expected \"tcp:PORT\" with a port from 1 to 65535"
                            )))
                        }
                    }
                }
                Ok(NetSetting(Net::Ports(ports)))
            }
        }
    }
}

/// A workflow's sandbox with the defaults of `steward.toml` applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sandbox {
    pub enabled: bool,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    pub net: Net,
    pub require: bool,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            enabled: true,
            read: Vec::new(),
            write: Vec::new(),
            net: Net::None,
            require: false,
        }
    }
}

impl Sandbox {
    /// `own` (a workflow's table) over `default` (steward.toml's); paths resolve against
    /// the config folder `root`.
    pub fn layered(default: &SandboxSettings, own: &SandboxSettings, root: &Path) -> Sandbox {
        let paths =
            |list: &[String]| -> Vec<PathBuf> { list.iter().map(|p| root.join(p)).collect() };
        Sandbox {
            enabled: own.enabled.or(default.enabled).unwrap_or(true),
            read: [paths(&default.read), paths(&own.read)].concat(),
            write: [paths(&default.write), paths(&own.write)].concat(),
            net: own
                .net
                .as_ref()
                .or(default.net.as_ref())
                .map_or(Net::None, |n| n.0.clone()),
            require: own.require.or(default.require).unwrap_or(false),
        }
    }

    /// The policy of one step: this sandbox, the run's scratch folder (read and write),
    /// and the folder of the step's own program (read, so it can run) — or the program
    /// file alone, when that folder holds the state folder or the systemd credentials.
    pub fn policy(&self, scratch: &Path, program: Option<&Path>) -> Policy {
        let mut read = self.read.clone();
        // scratch is STATE/scratch/RUN_ID.
        let state = scratch.parent().and_then(Path::parent).unwrap_or(scratch);
        if let Some(program) = program.filter(|p| p.is_absolute()) {
            read.push(match program_grant(program, state) {
                ProgramGrant::Folder(dir) => dir,
                ProgramGrant::FileAlone(_) => program.to_path_buf(),
            });
        }
        let mut write = self.write.clone();
        write.push(scratch.to_path_buf());
        // A private /tmp hides the host's: not for a step whose own files are there.
        let tmp = std::iter::once(scratch)
            .chain(read.iter().map(PathBuf::as_path))
            .chain(write.iter().map(PathBuf::as_path))
            .all(|p| !p.starts_with("/tmp"))
            .then(|| scratch.join("tmp"));
        Policy {
            read,
            write,
            net: self.net.clone(),
            tmp,
        }
    }

    /// What `steward validate` must say plainly of this sandbox on state folder `state`:
    /// a read grant that holds the state folder, a program granted alone.
    pub fn warnings(&self, state: &Path, programs: &[&Path]) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.read {
            if state.starts_with(r) {
                out.push(format!(
                    "[sandbox] read has {}, which holds the state folder: its steps can read every run record, key and approval there",
                    r.display()
                ));
            }
        }
        for program in programs {
            if let ProgramGrant::FileAlone(why) = program_grant(program, state) {
                out.push(format!(
                    "{} lives in a folder that holds {why}: the sandbox grants the program file alone, not its folder",
                    program.display()
                ));
            }
        }
        out
    }

    /// One line for `steward validate`: what a step of this workflow may do.
    pub fn summary(&self, root: &Path) -> String {
        if !self.enabled {
            return "sandbox off: its maker and checker can do anything steward's user can".into();
        }
        let show = |p: &PathBuf| {
            p.strip_prefix(root)
                .map(|r| r.display().to_string())
                .unwrap_or_else(|_| p.display().to_string())
        };
        let list = |l: &[PathBuf]| l.iter().map(show).collect::<Vec<_>>().join(", ");
        let mut parts = vec!["reads the system".to_string()];
        if !self.read.is_empty() {
            parts[0].push_str(&format!(" and {}", list(&self.read)));
        }
        parts.push(if self.write.is_empty() {
            "writes its scratch folder only".to_string()
        } else {
            format!("writes its scratch folder and {}", list(&self.write))
        });
        parts.push(match &self.net {
            Net::None => "no network".to_string(),
            Net::Any => "any network".to_string(),
            Net::Ports(p) => format!(
                "TCP to port {}",
                p.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
            ),
        });
        if self.require {
            parts.push("required".into());
        }
        format!("sandbox: {}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Result<SandboxSettings, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn net_is_none_any_or_tcp_ports() {
        assert_eq!(table("net = \"any\"").unwrap().net.unwrap().0, Net::Any);
        assert_eq!(
            table("net = [\"tcp:443\", \"tcp:8080\"]")
                .unwrap()
                .net
                .unwrap()
                .0,
            Net::Ports(vec![443, 8080])
        );
        let err = table("net = [\"udp:53\"]").unwrap_err().to_string();
        assert!(err.contains("tcp:PORT"), "{err}");
        let err = table("net = \"all\"").unwrap_err().to_string();
        assert!(err.contains("\"none\", \"any\""), "{err}");
        assert!(table("nett = \"any\"").is_err());
    }

    #[test]
    fn a_workflow_overrides_the_default_and_adds_paths() {
        let root = Path::new("/cfg");
        let default =
            table("enabled = true\nread = [\"shared\"]\nnet = [\"tcp:443\"]\nrequire = true")
                .unwrap();
        let own = table("read = [\"data\"]\nwrite = [\"/srv/out\"]\nnet = \"none\"").unwrap();
        let s = Sandbox::layered(&default, &own, root);
        assert!(s.enabled && s.require);
        assert_eq!(
            s.read,
            [PathBuf::from("/cfg/shared"), PathBuf::from("/cfg/data")]
        );
        assert_eq!(s.write, [PathBuf::from("/srv/out")]);
        assert_eq!(s.net, Net::None);
        assert_eq!(
            s.summary(root),
            "sandbox: reads the system and shared, data; writes its scratch folder and /srv/out; no network; required"
        );
        let off = Sandbox::layered(&default, &table("enabled = false").unwrap(), root);
        assert!(!off.enabled);
    }
}

/// What of a step's program the sandbox grants for reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramGrant {
    /// Its folder (so it can read its own files beside it).
    Folder(PathBuf),
    /// The file alone: its folder holds what no step may read (said in words).
    FileAlone(String),
}

/// The grant for `program` with the state folder at `state`.
pub fn program_grant(program: &Path, state: &Path) -> ProgramGrant {
    let Some(dir) = program.parent() else {
        return ProgramGrant::FileAlone("nothing".into());
    };
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (dir_abs, state_abs) = (absolute(dir), absolute(state));
    if state_abs.starts_with(&dir_abs) {
        return ProgramGrant::FileAlone(format!("the state folder {}", state_abs.display()));
    }
    if let Some(creds) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        if Path::new(&creds).starts_with(&dir_abs) {
            return ProgramGrant::FileAlone("the systemd credentials".into());
        }
    }
    ProgramGrant::Folder(dir.to_path_buf())
}
