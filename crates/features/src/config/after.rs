//! The checks of `after` triggers across workflows: each names workflows that exist, and
//! no chain comes back to where it started (a cycle would fire forever).

use std::collections::{BTreeMap, BTreeSet};

use crate::workflow::file::{list_or_none, ConfigError};
use crate::workflow::Workflow;

/// The problems of the `after` triggers of `workflows` (workflows in `broken` failed to
/// load: their own errors say why, and naming them is no error here).
pub fn errors(
    workflows: &BTreeMap<String, Workflow>,
    broken: &BTreeSet<String>,
) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for wf in workflows.values() {
        let Some(after) = wf.trigger.after() else {
            continue;
        };
        for up in &after.upstream {
            if up == &wf.id {
                out.push(ConfigError::whole_file(
                    &wf.file,
                    format!("trigger.after: `{}` follows itself", wf.id),
                ));
            } else if !workflows.contains_key(up) && !broken.contains(up) {
                let known: Vec<String> = workflows.keys().cloned().collect();
                out.push(ConfigError::whole_file(
                    &wf.file,
                    format!(
                        "trigger.after: no workflow named `{up}` (known: {})",
                        list_or_none(&known)
                    ),
                ));
            }
        }
    }
    for cycle in cycles(workflows) {
        let first = &workflows[&cycle[0]];
        let mut names = cycle.clone();
        names.push(cycle[0].clone());
        out.push(ConfigError::whole_file(
            &first.file,
            format!(
                "trigger.after: a cycle of workflows following each other: {} (each end would fire the next forever)",
                names.join(" → ")
            ),
        ));
    }
    out
}

/// Each cycle of `after` edges (follower → upstream... read upstream → follower), once,
/// starting from its smallest name.
fn cycles(workflows: &BTreeMap<String, Workflow>) -> Vec<Vec<String>> {
    // Who fires whom: upstream → its followers.
    let mut fires: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for wf in workflows.values() {
        for up in wf
            .trigger
            .after()
            .map(|a| a.upstream.as_slice())
            .unwrap_or_default()
        {
            if up != &wf.id {
                fires.entry(up.as_str()).or_default().push(wf.id.as_str());
            }
        }
    }
    let mut found: Vec<Vec<String>> = Vec::new();
    let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
    for start in fires.keys() {
        let mut path = vec![*start];
        walk(&fires, start, &mut path, &mut |cycle| {
            // The same cycle found from another of its members: keep one rotation.
            let at = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
            let rotated: Vec<String> = cycle[at..]
                .iter()
                .chain(&cycle[..at])
                .map(|s| s.to_string())
                .collect();
            if seen.insert(rotated.clone()) {
                found.push(rotated);
            }
        });
    }
    found
}

/// Depth-first from `node` along `fires`, calling `cycle` with each path that comes back
/// to its start.
fn walk<'a>(
    fires: &BTreeMap<&'a str, Vec<&'a str>>,
    node: &'a str,
    path: &mut Vec<&'a str>,
    cycle: &mut dyn FnMut(&[&'a str]),
) {
    for &next in fires.get(node).map(Vec::as_slice).unwrap_or_default() {
        if next == path[0] {
            cycle(path);
        } else if !path.contains(&next) {
            path.push(next);
            walk(fires, next, path, cycle);
            path.pop();
        }
    }
}
