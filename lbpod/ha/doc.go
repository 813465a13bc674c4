// Package ha elects which replica of a Service's lb pods holds the LB addresses: one active, the
// others standby, and a failover in well under a second without the API server.
//
// # Protocol
//
// VRRP-like, over the underlay itself. The active multicasts an Advert every Interval (100 ms) on
// net1, as a raw Ethernet frame of the local experimental EtherType 0x88B5 to the group's own
// multicast address (Group.MAC), through an AF_PACKET socket. Why raw Ethernet and not IP:
//   - it crosses exactly the L2 that ARP/NDP for the addresses crosses: a standby that hears the
//     active knows that the clients' ARP requests reach the active too, and silence means the
//     active is gone from the L2 the clients use, whatever the cluster network says;
//   - a standby has no address on net1 (that is what standby means), so it could not send IP
//     from there; IPv6 link-local would work but needs DAD and a per-pod link-local address, and
//     would behave differently for IPv4-only underlays with IPv6 filtered;
//   - it needs only CAP_NET_RAW, which the lb pod has; net1, a macvlan, passes up only the
//     multicast addresses joined on it, so other Services' adverts do not even reach the socket,
//     and a BPF program on the group drops the few that do: 100 Services on one L2 do not wake
//     each other, and a node's lb pods do not each get a copy of every advert.
//
// An advert carries the group (a digest of the LB addresses: the Services' replicas elect among
// themselves only), a term, the priority, the sender ID (its net1 MAC), the sender's interval and
// a "resigning" flag; with a key (below) also a sequence number and a tag. Standbys are silent.
//
// A frame that no replica of the Service can send is refused, changes nothing, and is counted
// (Output.Refused, lbpod_ha_adverts_rejected_total{reason}): a term above MaxTerm (2^63-1; a term
// of 2^64-1 used to make the active step down and the next term wrap to 0), an interval outside
// Config's accepted range (10 ms to 2 s by default; 65.535 s used to make every replica wait over
// three minutes), a zero or group MAC as sender. Without a key that is all: a plausible forged
// frame (a resignation, or a newer term with a sane interval, from a made-up sender) is obeyed
// like a real one. With a key every frame is authenticated, see Authentication.
//
//   - Start: release whatever an earlier incarnation left on net1, listen as standby.
//   - A new Service's first holder (First, Granted): with a record that has never named a holder
//     (its Lease absent, or naming no holder), each replica offers its next claim there and the API
//     server lets one write through; that replica takes over at once, unless it has heard another
//     replica meanwhile, instead of after the dead interval. Otherwise the dead interval decides.
//     The granted claim is term 1, which no other takeover uses (Config.FirstClaims).
//   - A standby that hears no advert for the dead interval (3 of the active's intervals) plus a
//     skew (priority, then a slot from the ID; at most half an interval) takes over with
//     term = highest term seen + 1 (at least 2 with FirstClaims): it adds the addresses, announces
//     them, and advertises at once.
//   - Two actives that hear each other settle at the first advert: the newer term wins, then the
//     higher priority, then the higher ID. The winner answers a losing advert at once, so the
//     loser lets go within one delivery. No preemption by default (Config.Preempt).
//   - SIGTERM on the active (pod deleted, node drained, image rolled): it sends "resigning"
//     adverts and keeps the addresses; a standby that follows it (last heard its advert, and no
//     newer term) takes over after its skew only (tens of milliseconds, not the dead interval;
//     any other resignation moves nothing); the resigning replica releases when it hears the
//     successor's advert, or after one interval if nobody takes over. Make before break.
//   - Frozen (SIGSTOP, a paused VM, a starved CPU): the machine knows when it asked to be woken
//     (an active every interval, a standby at its deadline), so an input later than that by more
//     than the dead interval means it was stopped. The others had time to take over with a newer
//     term, and an active must not fight them: it sends nothing until the runner has fed it every
//     advert that waited in its socket meanwhile (Verifying, then Verified). A successor's
//     takeover advert is among them, and makes it let go as any older active does; if there is
//     none (its peers died with their node, or are as starved), it keeps the addresses and
//     advertises at once: letting go would leave nobody holding them (a whole node's actives
//     failing over to one starved node stepped down 28 times for this in one run). An advert
//     still on the wire when it resumes meets the usual rule within one delivery, and the
//     Lease fences a successor it cannot hear. A frozen standby listens again.
//   - Starved, not frozen (hundreds of pods on two cores): the fixed figures assume a replica runs
//     within a fraction of the interval. Each replica measures its lateness (how long after the
//     wake time it asked for an input came; as a standby also the gaps between the active's
//     adverts) and keeps a slack of twice the worst lateness seen, at most Config.MaxSlack (3 s),
//     decaying by a twentieth of the time that passes. The active advertises its interval
//     stretched by its slack, so the standbys wait longer for it; a standby adds its own slack
//     to its wait; a replica reads every advert already queued in its sockets at every wake
//     before it decides (after a stall the timer and the sockets are ready at once). The holder's frozen
//     check goes by the shortest dead interval it advertised lately, so the stretch never lets
//     an active keep the addresses past the time a standby may take them. The price is a slower
//     failover on a starved node (up to 3.3 s), and the sub-second figure back within a minute
//     of calm; the gain is that the replicas stop taking the addresses from each other at every
//     stall (each turn costs announcements and a Lease write): TestStarvationDoesNotFlap counts
//     115 takeovers in 60 simulated seconds without the slack and 1 with it.
//   - Link down on net1: an active releases at once (it cannot serve), and comes back as a
//     standby that listens a whole dead interval before it may claim.
//   - A standby whose data path is not ready (Readier: rules not applied, Service unknown) does
//     not claim, so that a ready one does; an active is never made to step down by it, since a
//     passing error in the data path should not cost a failover.
//
// Machine is the pure decision (events in, what to do out; table and model tests); Run is the thin
// effect around it: the sockets, the clock, net1's link state and the Holder (the data path). A
// standby is not woken by the active's adverts: they wait in a queue socket with the kernel's
// receive time until its deadline, and are fed to the machine as of that time (conn, drain); only
// resignations wake it. It wakes about once per dead interval instead of once per advert. Junk
// that passes the socket filter (anyone can make it) can fill that queue: a read that missed
// frames is an input (Lost), on which the standby defers its claim by one dead interval, once per
// advert heard, and reads at once meanwhile (Machine.Queueing).
//
// # Authentication
//
// The operator creates a Secret of 32 random bytes with each claim of an address, mounts it in
// that Service's lb pods only, and passes it to lbpod (--ha-key-file, Options.Key). With it every
// advert and every resignation is sealed, wire version 2 (auth.go): the 32-byte header of
// version 1, a sequence number (uint64), and HMAC-SHA256 over a fixed context string and all the
// bytes before the tag, truncated to 16 bytes. The context and the group under the tag tie the key
// to this use and this group; 128 bits of tag leave a forger one guess per frame on the wire.
// A receiver with the key refuses, counts and otherwise ignores (no role change, no term learnt,
// no timer moved):
//   - a version-2 frame whose tag does not verify (reason auth): a forger, or a replica of an
//     earlier claim of the address with the key of that claim;
//   - a version-1 frame (unauthenticated), except in the legacy window (below);
//   - a verified frame whose sequence is not above the last one it accepted from that sender
//     (replay): a captured frame sent again;
//   - a verified frame whose sequence lies further than Config.ReplayWindow (--ha-replay-window,
//     10 s) from its own wall clock (stale): a capture replayed later to a receiver that never
//     heard it (a new pod, a restarted process: the Replay state is per process).
//
// The sequence is the sender's wall clock in microseconds, and at least one more than the last
// (Sequencer): it stays increasing when the clock stands or steps back by less than half the
// window, and a process restarted in the same pod (same net1 MAC, the same sender to the others)
// starts above what it sent before, from its wall clock. A larger step back restarts it from the
// clock, and a receiver whose clock steps back by more than a quarter of the window forgets the
// numbers it kept; otherwise a step of the nodes' clocks (NTP correcting them all) had the
// receivers refuse every advert as stale or a replay until the clock caught up
// (TestClockStepBack). The receiver keeps the last sequence of each verified sender only, at most
// 32 (the oldest goes first), so a forger cannot fill it. The Machine keeps its monotonic clock;
// the runner passes the wall time to the Guard for this check alone.
//
// Why 10 s: the window must exceed the clock skew between nodes, or a live active's adverts are
// refused as stale by its standbys, which then claim: two holders for as long as the clocks
// disagree. Nodes kept by NTP or chrony agree within milliseconds; a node without any time
// service drifts by tens of parts per million, seconds a day; Kubernetes needs synchronised
// clocks anyway (certificates, tokens). The window is also how long a replay can mislead a
// receiver that never heard the sender: the captured adverts of a dead active, replayed in order,
// keep such a receiver waiting until the last of them is older than the window, so they can
// delay its takeover by the window plus one dead interval, once per new receiver (a receiver that
// heard the sender refuses them all as replays). A replayed resignation moves a standby only when
// it comes from the active the standby follows, at a term no older than one it knows: once it has
// heard the successor's advert, the old active's resignations change nothing
// (TestResignationOnlyFromFollowedActive; the model checks it, checkResignedTakeover). A receiver
// that just started, or got its link back, counts a resignation only from one advert interval
// after (listen), by when a live successor's advert has reached it; replayed to one that could not
// hear the successor for another reason (a partition it cannot see, just healed), a resignation
// can still make it claim once: one takeover more, which the overlap bound covers. 10 s keeps both
// small next to the minutes a pod replacement takes, and tolerates a skew a thousand times larger
// than NTP leaves; refused frames say "stale" in the log and the metric, so a bad clock shows.
//
// # Upgrade from unauthenticated replicas
//
// lbpod before wire version 2 sends version 1 and does not read version 2 (its socket filter drops
// it). A rolling update (maxSurge 1, maxUnavailable 0) runs old and new pods side by side. A new
// replica therefore accepts version-1 frames only while legacyOpen: it has heard no authenticated
// advert of its group (once it has, a replica with the key is there, and version 1 can only be an
// old replica's or forged), it has never been active (a forged resignation or newer term must not
// make an active let go), and it started less than Config.LegacyWindow ago (--ha-legacy-window,
// 2 minutes; 0: never). So the new pod defers to the old active, and at its resignation takes
// over: after its skew and half an interval (legacyDelay), so that an old standby, which cannot
// hear the new replica, claims first if there is one, and the new one defers to it; and within the
// interval the resigning old active keeps the addresses for a successor, so nothing is left
// unheld. The old active cannot read the new one's adverts, so it keeps the addresses until that
// interval ends (20 to 50 ms beside the new holder, make before break) instead of one delivery.
// Afterwards the new replica refuses version 1 (counted unauthenticated).
// TestUpgradeFromUnauthenticated and TestUpgradeOldStandby check both orders of a rollout, and
// test/dataplane's TestHALBPodUpgrade the real binaries. Why 2 minutes: a rollout of 2 to 5 lb
// pods replaces one pod at a time, each in seconds when the image is cached; 2 minutes covers a
// slow pull and leaves the first new pod time to see the last old one go.
//
// What remains, precisely:
//   - Within a new replica's legacy window, before it hears its first authenticated advert and
//     before it is first active, a forger on the L2 is as good as an old replica: version-1 adverts
//     keep it waiting, a version-1 resignation in the name of the active it follows makes it
//     claim (after its skew and half an interval). In a group with a live active that is one
//     extra takeover at most (the first authenticated advert, within an interval of the start,
//     closes the window), though a forged term it learnt then can push the group's term to
//     MaxTerm, where it saturates and conflicts are settled by priority and ID alone. In a
//     brand-new group (all replicas new, no active yet) it can delay the first claim by at most
//     the window, plus one dead interval of the longest accepted interval (3 × 2 s, and the
//     slack): the model test's liveness bound with the window open. --ha-legacy-window=0 removes
//     it where no old replica can exist (a fresh claim).
//   - A rollout slower than the window: an old replica still there when the window ends is not
//     heard any more; if it is the active, the new replica claims, and the old one, which cannot
//     read version 2, keeps the addresses too until the rollout removes it.
//   - Replicas with different keys (the Secret rotated under running pods: each process reads its
//     key once, at start) refuse each other (auth) and each elects its own active: the operator
//     must roll the lb pods when it rotates the key, as a new claim does.
//   - Whoever holds the key (the Service's lb pods, whoever can read the Secret) can forge, and
//     anyone on the L2 can still answer ARP for the address or drop the adverts: the key protects
//     the election, not the L2.
//
// # Upgrade to group addresses
//
// lbpod before group addresses sends to MulticastMAC and listens only there. A replica listens
// on both addresses and marks every frame it sends (flagGroupAddressed, covered by the tag).
// Whenever it accepts a frame of its own wire version without that mark from another replica (an
// old replica's: authenticated when it has a key; a frame with its own ID, which the guard passes
// on unverified for the machine to ignore, does not count: TestRunCopiesForOldReplicas), it
// also sends a copy of each advert to MulticastMAC until Config.CopyWindow (--ha-copy-window, 2 minutes; not
// --ha-legacy-window, which the operator sets to 0 for a Deployment rolling from those replicas) has passed since
// (runner.copyToLegacy): with its own sequence number (a receiver that gets both accepts both, as
// two adverts) and marked as a copy (flagLegacyCopy), which the socket filter of a replica that
// hears the group's address drops, so new replicas read each advert once. An old standby thus
// hears a new active, and a new standby an old active, for as long as a rollout runs old replicas
// beside new ones. An old standby sends nothing, so a new active cannot know it is there: one that
// outlives the window stops hearing the active and claims, the active hears that claim, unmarked,
// and copies again: one extra takeover, no lasting two holders. Options.NoGroupAddress runs a
// replica as the release before (the upgrade tests' old replicas; an underlay that passes only the
// one address).
//
// # Safety
//
// On a healthy L2 every replica hears every advert within a delivery time d (microseconds to a
// millisecond, far below the interval). Two replicas can hold at once only when both claimed
// before hearing each other: two standbys within d of each other (the skew makes that rare), or
// both sides of a partition that just healed. Both cases end at the first advert either sends
// after they hear each other, so the overlap is bounded by one interval plus 2d: the model test
// checks exactly this bound under kill -9, SIGSTOP/SIGCONT, SIGTERM, link loss and invisible
// partitions, and that after any history exactly one replica holds once the faults are repaired.
// A replica that is alive, hears the others and is not frozen never keeps the addresses against
// an active with a newer term.
//
// What the protocol alone cannot do: fence a kernel whose process is gone. The addresses stay on
// net1 of a pod whose lbpod was killed or stopped until the process comes back (it releases first
// thing at start and on resume) or the pod's network namespace goes; meanwhile that kernel still
// answers ARP requests sent to it. Two things bound this. The successor's announcement burst moves
// every client's neighbour entry, and Linux clients then probe the new MAC by unicast, so nobody
// asks the old one. And a Holder that implements Leaser keeps the addresses on a kernel lifetime
// of a second, renewed as the adverts go out: the kernel removes them by itself about a second
// after the process stopped renewing (measured: 0.6 to 0.8 s after the failover). A node
// failure removes the old kernel altogether. The fence never silently goes away: a renewal that
// fails (Leaser.Renew's error) makes the active release the addresses and resign at once
// (RenewFailed), as a stop would; and the lb pod's loop adds and repairs the addresses on the
// same lifetime, never without one (lbpod.State.AddressLifetime).
//
// # The API server
//
// Not in the detection path: in steady state the replicas write nothing (adverts are L2 frames).
// The replica that takes over writes the Service's Lease once (cmd/lbpod: holder, transitions,
// and its claim: term, priority, ID), beside the election, never renewed; the operator mirrors it
// into the role labels, the Service's annotations and condition, the IP object's status and an
// Event. A failed write never delays a takeover. The Lease is a record and a fence, not a lock
// (Record, Superseded):
//
//   - A replica writes it only with a claim newer than the recorded one by the election's own
//     order (term, priority, ID; Claim.Compare), by an update that carries the version it read
//     (on a conflict it reads again and compares again), so it is never written back over a
//     newer claim, and it changes once per claim.
//   - Every replica watches it and feeds each recorded claim to its machine (Superseded), as if
//     it had heard that replica's advert: it learns the term, and an active (or resigning)
//     replica with an older claim lets go at once, without announcing. That ends two holders
//     that do not hear each other, whatever the direction of the loss, within the API's latency
//     (a write and a watch) of the newer claim.
//   - An active that lets go this way never heard the winner on the underlay: both held the
//     addresses. It says so once (Output.Superseded; cmd/lbpod writes a note into the Lease, from
//     which the operator raises the AddressHeldTwice Warning), and it waits SupersededBackoff
//     (30 s, doubling to 2 min) beyond the dead interval before it may claim again, since it
//     cannot hear the holder it would take the addresses from. Without that wait the two would
//     take turns every dead interval, each turn two Lease writes and a move of the clients; with
//     it the Lease is written at most 4 times in any minute of lasting advert loss
//     (TestRecordBoundsSplitBrain), and after the first fence one replica holds, but for the API's
//     latency after each such claim. Any advert heard ends the wait (with a key, an
//     authenticated one: a forged version-1 frame does not), so on a healthy underlay
//     (where nobody is superseded through the Lease) failover is unchanged. The price: an active
//     that dies while adverts are still lost is replaced after the wait, not after 0.3 s.
//   - An active that took over before the Lease named any claim to it (the API server
//     unreachable since its start) could not pass the recorded term, often a dead pod's: it does
//     not let go for the first claim it then reads, but takes the next term and advertises it
//     at once, and the write of that claim fences the older claim's author should it be alive
//     and unheard. Once per process, so two replicas cannot go back and forth on it; before, it
//     let go and nobody held the addresses for the 30 s wait (TestModelBlindTakeover).
//
// Faults, one by one:
//   - API server unreachable: elections go on unchanged, failovers take the same time; only the
//     visible role lags (the Lease write is retried with backoff) until the API is back, and the
//     fence waits for it: two replicas that neither hear each other nor reach the API server both
//     hold the addresses until one of them does.
//   - Underlay partition: each side that has a replica elects its own active (a replica cannot
//     tell a dead active from an unreachable one); the Lease then fences the older claim, so the
//     side whose replica claimed last serves. Adverts lost one way: the replica that does not
//     hear the active claims; its adverts reach the old active, which steps down as on a healthy
//     underlay (no fence needed). When a partition heals, the holder's adverts reach the others
//     and end any wait; should two still hold (no API), the newer term keeps the addresses within
//     one interval (the other releases without announcing; 70 ms in the dataplane test), and the
//     winner's next announcement corrects any client that learnt the loser.
//   - net1's own link lost: that replica releases at once; it cannot be one of two holders.
//   - The Lease lives in the Service's namespace, where its tenant may write: a forged claim can
//     make that Service's own replicas step down and wait (the tenant's own Service only), and a
//     claim no replica makes (a term above MaxTerm, a non-unicast sender) is ignored (ParseClaim).
package ha
