//! [`DistEnv`]: this process's place in a distributed run, from the variables torchrun sets.
//!
//! The names and meanings are torchrun's, so a cluster launcher (torchrun, Slurm `srun` with the
//! usual exports, mpirun) or `cargo xtask launch` starts cartage programs unchanged:
//!
//! | variable      | meaning                                                       |
//! |---------------|---------------------------------------------------------------|
//! | `RANK`        | this process's rank in the whole group, `0..WORLD_SIZE`       |
//! | `WORLD_SIZE`  | the number of processes in the group                          |
//! | `LOCAL_RANK`  | this process's rank on its node; it chooses the node's device |
//! | `MASTER_ADDR` | the host where rank 0 listens for the rendezvous              |
//! | `MASTER_PORT` | the TCP port rank 0 listens on                                |
//!
//! With neither `RANK` nor `WORLD_SIZE` set, the program is a group of one (rank 0) and needs
//! nothing else. Otherwise `RANK` and `WORLD_SIZE` are required, and so are `MASTER_ADDR` and
//! `MASTER_PORT` when `WORLD_SIZE` is above 1. A missing or malformed value is an
//! [`Error::InvalidArgument`] naming the variable and its value: that includes a value that is
//! not UTF-8 (never read as "unset"), a `WORLD_SIZE` above [`MAX_WORLD_SIZE`] (sizes are checked
//! before the rendezvous allocates anything per rank), a `RANK` or `LOCAL_RANK` outside the
//! group, and a `MASTER_PORT` outside 1..=65535.

use cartage_core::{Error, Result};

/// The rank of this process in the group.
pub const RANK_ENV: &str = "RANK";
/// The number of processes in the group.
pub const WORLD_SIZE_ENV: &str = "WORLD_SIZE";
/// The rank of this process on its node (it chooses the device, through `Device::pick()`).
pub const LOCAL_RANK_ENV: &str = "LOCAL_RANK";
/// The host where rank 0 listens for the rendezvous.
pub const MASTER_ADDR_ENV: &str = "MASTER_ADDR";
/// The TCP port rank 0 listens on.
pub const MASTER_PORT_ENV: &str = "MASTER_PORT";

/// The largest `WORLD_SIZE` accepted: 2^20 (1,048,576) processes, far above any real run. The
/// rendezvous keeps one slot per rank, so a larger value (a typo, or a hostile environment) is
/// refused before anything is allocated for it.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// This process's place in a distributed run. See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistEnv {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// This process's rank on its node, when the launcher set `LOCAL_RANK`.
    pub local_rank: Option<usize>,
    /// Where rank 0 listens (`127.0.0.1` for a group of one).
    pub master_addr: String,
    /// The port rank 0 listens on (`0` for a group of one: no rendezvous).
    pub master_port: u16,
}

impl DistEnv {
    /// A group of one: rank 0 of 1, no rendezvous.
    pub fn single() -> DistEnv {
        DistEnv {
            rank: 0,
            world_size: 1,
            local_rank: None,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
        }
    }

    /// This process's place, read from the environment (see the module docs).
    ///
    /// ```
    /// use cartage::distributed::DistEnv;
    /// // Run without a launcher: a group of one.
    /// # if std::env::var_os("WORLD_SIZE").is_none() && std::env::var_os("RANK").is_none() {
    /// assert_eq!(DistEnv::from_env()?.world_size, 1);
    /// # }
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn from_env() -> Result<DistEnv> {
        for name in [
            RANK_ENV,
            WORLD_SIZE_ENV,
            LOCAL_RANK_ENV,
            MASTER_ADDR_ENV,
            MASTER_PORT_ENV,
        ] {
            if let Some(value) = std::env::var_os(name)
                && value.to_str().is_none()
            {
                return Err(bad(
                    name,
                    &value.to_string_lossy(),
                    "it is not valid UTF-8 (the replacement characters show where)",
                ));
            }
        }
        DistEnv::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`DistEnv::from_env`], with the variables read through `lookup` (for tests and for
    /// launchers that name them differently).
    ///
    /// ```
    /// use cartage::distributed::DistEnv;
    /// let vars = [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"),
    ///             ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
    /// let env = DistEnv::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))?;
    /// assert_eq!((env.rank, env.world_size, env.local_rank, env.master_port), (1, 2, Some(1), 29500));
    ///
    /// let bad = DistEnv::from_lookup(|name| (name == "RANK" || name == "WORLD_SIZE").then(|| "two".to_string()));
    /// assert!(bad.unwrap_err().to_string().contains("RANK=`two`"));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<DistEnv> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let (rank, world_size) = (get(RANK_ENV), get(WORLD_SIZE_ENV));
        let local_rank = get(LOCAL_RANK_ENV).map(|v| count(LOCAL_RANK_ENV, &v)).transpose()?;
        if rank.is_none() && world_size.is_none() {
            return Ok(DistEnv {
                local_rank,
                ..DistEnv::single()
            });
        }
        let rank = count(RANK_ENV, &required(RANK_ENV, rank)?)?;
        let world_size = count(WORLD_SIZE_ENV, &required(WORLD_SIZE_ENV, world_size)?)?;
        if world_size == 0 {
            return Err(bad(WORLD_SIZE_ENV, "0", "a group has at least one process"));
        }
        if world_size > MAX_WORLD_SIZE {
            return Err(bad(
                WORLD_SIZE_ENV,
                &world_size.to_string(),
                &format!("a group has at most {MAX_WORLD_SIZE} processes"),
            ));
        }
        if rank >= world_size {
            return Err(bad(
                RANK_ENV,
                &rank.to_string(),
                &format!("ranks run from 0 to WORLD_SIZE - 1 = {}", world_size - 1),
            ));
        }
        if let Some(local) = local_rank
            && local >= world_size
        {
            return Err(bad(
                LOCAL_RANK_ENV,
                &local.to_string(),
                &format!("a node cannot hold more ranks than the WORLD_SIZE of {world_size}"),
            ));
        }
        if world_size == 1 {
            return Ok(DistEnv {
                rank,
                world_size,
                local_rank,
                ..DistEnv::single()
            });
        }
        let master_addr = required(MASTER_ADDR_ENV, get(MASTER_ADDR_ENV))?;
        let port = required(MASTER_PORT_ENV, get(MASTER_PORT_ENV))?;
        let master_port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(bad(MASTER_PORT_ENV, &port, "a TCP port is a number from 1 to 65535")),
        };
        Ok(DistEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        })
    }

    /// True for rank 0, the rank that prints, saves and hosts the rendezvous.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

fn required(name: &str, value: Option<String>) -> Result<String> {
    value.ok_or_else(|| {
        Error::invalid(
            "distributed environment",
            format!(
                "{name} is not set, but RANK or WORLD_SIZE is: a distributed run needs RANK, WORLD_SIZE, \
                 MASTER_ADDR and MASTER_PORT (torchrun and `cargo xtask launch` set them all)"
            ),
        )
    })
}

/// A non-negative integer, or an error naming the variable (and its value, cut short when long).
fn count(name: &str, value: &str) -> Result<usize> {
    value.parse::<usize>().map_err(|_| {
        let why = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
            format!("it is larger than any group ({MAX_WORLD_SIZE} processes at most)")
        } else {
            "it must be a non-negative integer".to_string()
        };
        bad(name, value, &why)
    })
}

#[cold]
fn bad(name: &str, value: &str, why: &str) -> Error {
    // An over-long value is shown cut short.
    let value: String = if value.chars().count() > 64 {
        value.chars().take(64).chain("…".chars()).collect()
    } else {
        value.to_string()
    };
    Error::invalid(
        "distributed environment",
        format!("{name}=`{value}` is not valid: {why}. Check how the launcher sets {name}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<DistEnv> {
        DistEnv::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
    }

    fn full(rank: &str, world: &str) -> Vec<(&'static str, String)> {
        vec![
            (RANK_ENV, rank.to_string()),
            (WORLD_SIZE_ENV, world.to_string()),
            (LOCAL_RANK_ENV, rank.to_string()),
            (MASTER_ADDR_ENV, "10.0.0.7".to_string()),
            (MASTER_PORT_ENV, "29501".to_string()),
        ]
    }

    fn parse_owned(vars: &[(&'static str, String)]) -> Result<DistEnv> {
        DistEnv::from_lookup(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn nothing_set_is_a_group_of_one() {
        assert_eq!(parse(&[]).unwrap(), DistEnv::single());
        let env = parse(&[(LOCAL_RANK_ENV, "0"), (RANK_ENV, " ")]).unwrap();
        assert_eq!((env.rank, env.world_size, env.local_rank), (0, 1, Some(0)));
    }

    #[test]
    fn a_full_set_reads_every_variable() {
        let env = parse_owned(&full("3", "4")).unwrap();
        assert_eq!(
            env,
            DistEnv {
                rank: 3,
                world_size: 4,
                local_rank: Some(3),
                master_addr: "10.0.0.7".into(),
                master_port: 29501,
            }
        );
        assert!(!env.is_main());
    }

    #[test]
    fn a_world_of_one_needs_no_master() {
        let env = parse(&[(RANK_ENV, "0"), (WORLD_SIZE_ENV, "1")]).unwrap();
        assert_eq!((env.rank, env.world_size, env.master_port), (0, 1, 0));
    }

    /// Every malformed or missing value is an error naming its variable (and the value).
    #[test]
    fn bad_values_name_their_variable() {
        let cases: Vec<(Vec<(&'static str, String)>, &str)> = vec![
            (vec![(RANK_ENV, "0".into())], "WORLD_SIZE is not set"),
            (vec![(WORLD_SIZE_ENV, "2".into())], "RANK is not set"),
            (
                full("0", "2")
                    .into_iter()
                    .filter(|(n, _)| *n != MASTER_ADDR_ENV)
                    .collect(),
                "MASTER_ADDR is not set",
            ),
            (
                full("0", "2")
                    .into_iter()
                    .filter(|(n, _)| *n != MASTER_PORT_ENV)
                    .collect(),
                "MASTER_PORT is not set",
            ),
            (full("x", "2"), "RANK=`x`"),
            (full("-1", "2"), "RANK=`-1`"),
            (full("2", "2"), "RANK=`2`"),
            (full("0", "0"), "WORLD_SIZE=`0`"),
            (full("0", "many"), "WORLD_SIZE=`many`"),
            (
                full("0", "2")
                    .into_iter()
                    .map(|(n, v)| {
                        if n == MASTER_PORT_ENV {
                            (n, "70000".into())
                        } else {
                            (n, v)
                        }
                    })
                    .collect(),
                "MASTER_PORT=`70000`",
            ),
            (
                full("0", "2")
                    .into_iter()
                    .map(|(n, v)| if n == LOCAL_RANK_ENV { (n, "5".into()) } else { (n, v) })
                    .collect(),
                "LOCAL_RANK=`5`",
            ),
            (vec![(LOCAL_RANK_ENV, "gpu0".into())], "LOCAL_RANK=`gpu0`"),
        ];
        for (vars, expected) in cases {
            let err = parse_owned(&vars).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
            assert!(err.to_string().contains(expected), "{expected:?} not in: {err}");
        }
    }
}
