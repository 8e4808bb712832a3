//! Redis Cluster key slots and `CLUSTER NODES` parsing: pure functions.

/// CRC16-CCITT (XModem), the checksum Redis Cluster hashes keys with.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`, honouring `{hash tags}`.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) & 16383
}

/// What this node does with a slot, from its own line of `CLUSTER NODES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Served here, not being moved.
    Stable,
    /// Served here but migrating to another node.
    Migrating,
    /// Not served here (or importing, not yet ours).
    Elsewhere,
}

/// The state of `slot` on the node whose `CLUSTER NODES` line is flagged `myself`. A replica
/// serves what its master serves (its own line lists no slots), and cannot see its master's
/// migrations (a node shows only its own): a slot its master serves is `Stable` to it.
pub fn slot_state(cluster_nodes: &str, slot: u16) -> SlotState {
    let Some(me) = cluster_nodes.lines().find(|l| {
        l.split_whitespace()
            .nth(2)
            .is_some_and(|f| f.split(',').any(|x| x == "myself"))
    }) else {
        return SlotState::Elsewhere;
    };
    let replica = me
        .split_whitespace()
        .nth(2)
        .is_some_and(|f| f.split(',').any(|x| x == "slave" || x == "replica"));
    if replica {
        let master = me.split_whitespace().nth(3);
        let line = cluster_nodes
            .lines()
            .find(|l| master.is_some() && l.split_whitespace().next() == master);
        return match line.map(|l| line_state(l, slot)) {
            Some(SlotState::Stable | SlotState::Migrating) => SlotState::Stable,
            _ => SlotState::Elsewhere,
        };
    }
    line_state(me, slot)
}

/// The state of `slot` by one node's `CLUSTER NODES` line.
fn line_state(me: &str, slot: u16) -> SlotState {
    let mut served = false;
    let mut migrating = false;
    for field in me.split_whitespace().skip(8) {
        if let Some(inner) = field.strip_prefix('[').and_then(|f| f.strip_suffix(']')) {
            // [slot->-node] migrating away, [slot-<-node] importing.
            if let Some((s, _)) = inner.split_once("->-") {
                if s.parse::<u16>() == Ok(slot) {
                    migrating = true;
                }
            }
            continue;
        }
        let (lo, hi) = match field.split_once('-') {
            Some((a, b)) => (a.parse::<u16>(), b.parse::<u16>()),
            None => (field.parse::<u16>(), field.parse::<u16>()),
        };
        if let (Ok(lo), Ok(hi)) = (lo, hi) {
            if (lo..=hi).contains(&slot) {
                served = true;
            }
        }
    }
    match (served, migrating) {
        (true, false) => SlotState::Stable,
        (true, true) => SlotState::Migrating,
        _ => SlotState::Elsewhere,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from CLUSTER KEYSLOT on a real server.
        let table: &[(&str, u16)] = &[
            ("foo", 12182),
            ("bar", 5061),
            ("123456789", 12739),
            ("{user1000}.following", 3443),
            ("{user1000}.followers", 3443),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("foo{bar}{zap}", 5061),
        ];
        for (key, slot) in table {
            assert_eq!(key_slot(key.as_bytes()), *slot, "{key}");
        }
    }

    #[test]
    fn slot_states_from_cluster_nodes() {
        let nodes = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000 [5000->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1] [6000-<-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
";
        assert_eq!(slot_state(nodes, 0), SlotState::Stable);
        assert_eq!(slot_state(nodes, 5460), SlotState::Stable);
        assert_eq!(slot_state(nodes, 7000), SlotState::Stable);
        assert_eq!(slot_state(nodes, 5000), SlotState::Migrating);
        assert_eq!(
            slot_state(nodes, 6000),
            SlotState::Elsewhere,
            "importing is not ours yet"
        );
        assert_eq!(slot_state(nodes, 5461), SlotState::Elsewhere);
        assert_eq!(slot_state("", 1), SlotState::Elsewhere);
    }

    #[test]
    fn a_replica_serves_what_its_master_serves() {
        let nodes = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 myself,slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 master - 0 0 1 connected 0-5460 7000
";
        assert_eq!(slot_state(nodes, 0), SlotState::Stable);
        assert_eq!(slot_state(nodes, 7000), SlotState::Stable);
        assert_eq!(
            slot_state(nodes, 5461),
            SlotState::Elsewhere,
            "another master's"
        );
        let orphan = nodes.replace(
            "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001",
            "x 127.0.0.1:30001",
        );
        assert_eq!(
            slot_state(&orphan, 0),
            SlotState::Elsewhere,
            "no master line"
        );
    }
}
