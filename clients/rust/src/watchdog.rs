//! The watchdog (rule 2): the one task per lease that renews it in the background and marks
//! it lost when its local deadline passes; a durable lease's renewal counts only once
//! acknowledged (rule 10).

use std::sync::Arc;

use tokio::time::Instant;

use crate::error::LossReason;
use crate::retry::{backoff, is_transient};
use crate::state::{Renewal, State};
use crate::sync::lock;

/// The watchdog (rule 2) and the lease clock: renews at a third of the ttl with a
/// token-qualified RENEW, stops for good at the first nil, retries connection failures but
/// never sends a RENEW once the local deadline passed, and marks the lease lost when its
/// local deadline passes. With `renew` off it only watches the deadline. On a durable lease a
/// renewal that too few replicas acknowledged leaves the deadline and is sent again after a
/// pause (each one waits at most the durable timeout, cut at the deadline).
pub(crate) async fn keeper(st: Arc<State>, renew: bool) {
    loop {
        let (deadline, ttl, last_sent, released) = {
            let t = lock(&st.timing);
            (t.deadline, t.ttl, t.last_sent, t.released)
        };
        if released || *st.lost.borrow() {
            return;
        }
        let due = if renew {
            (last_sent + ttl / 3).min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            _ = st.wake.notified() => continue,
        }
        if lock(&st.timing).released {
            return;
        }
        let deadline = lock(&st.timing).deadline;
        if Instant::now() >= deadline {
            st.mark_lost(LossReason::DeadlinePassed);
            return;
        }
        if !renew {
            continue;
        }
        let ttl = lock(&st.timing).ttl;
        // Retries until the local deadline; every attempt is cut off at it.
        let mut attempt = 0u32;
        loop {
            // A manual renew() may have moved the deadline meanwhile.
            let deadline = lock(&st.timing).deadline;
            if Instant::now() >= deadline {
                st.mark_lost(LossReason::DeadlinePassed);
                return;
            }
            match st.renew_once(ttl, deadline, !st.bound).await {
                Renewal::Renewed(sent) => {
                    st.renewed(sent, ttl);
                    break;
                }
                Renewal::Nil => {
                    st.mark_lost(LossReason::RenewRefused);
                    return;
                }
                Renewal::Short(_) => {
                    // Rule 10: renewed on the master but too few acknowledged: it does not
                    // count. Again after a pause, until the deadline runs out.
                    attempt += 1;
                }
                Renewal::Failed(e) => {
                    if st.bound || Instant::now() >= deadline || !is_transient(&e) {
                        st.mark_lost(if st.bound {
                            LossReason::Closed
                        } else if Instant::now() >= deadline {
                            LossReason::DeadlinePassed
                        } else {
                            // A refusal that no retry mends (WRONGTYPE: the key was
                            // written over): the grant ended some other way.
                            LossReason::Lost
                        });
                        return;
                    }
                    attempt += 1;
                }
            }
            let pause = backoff(attempt).min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
    }
}
