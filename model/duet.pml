/* duet's device-sharing protocol as a Promela model, checked by spin.
 *
 * One shared node with ND devices; NJ Slurm jobs (one step each, one device
 * each) and NP pods (one device each). model/README.md maps every process
 * and every step to the code it stands for, states I1, I2 and I3 as they
 * are checked here, and lists what is abstracted away.
 *
 * Compile-time switches (spin -DNAME=VALUE):
 *   NJ, NP          jobs and pods (1 or 2 each)
 *   MAXCRASH        crashes of duet-bridge (default 1)
 *   MAXSCANCEL      placeholders an admin cancels in Slurm (default 1)
 *   MAXBIND         bind attempts kube-scheduler makes per pod (default 2)
 *   BIND_HANDLERS   extender bind requests served at once (default 1)
 *   RELIST          the pod watch may list again at any time (default 0)
 *   NO_I1, NO_I2, NO_I3   leave that invariant's monitor out
 *   I2_STRICT, I2C_AT_LIST   stricter readings of I2 that the code does not
 *                   meet (model/README.md, "What the model found")
 * Mutations, each removing one safeguard the code has (model/README.md):
 *   BUG_NO_FENCE, BUG_EARLY_ANSWER, BUG_RELEASE_ON_TERMINATING,
 *   BUG_SYNC_NO_LIVENESS, BUG_STALE_NO_LIVENESS
 */

#define ND 2
#ifndef NJ
#define NJ 1
#endif
#ifndef NP
#define NP 1
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXSCANCEL
#define MAXSCANCEL 1
#endif
#ifndef MAXBIND
#define MAXBIND 2
#endif
#ifndef RELIST
#define RELIST 0
#endif
#ifndef BIND_HANDLERS
#define BIND_HANDLERS 1
#endif

/* ---- owners ------------------------------------------------------------
 * The ledger's owners as bits of a byte: STEP(j) is job j's step
 * (Owner::SlurmStep), JOB(j) its imported job (Owner::SlurmJob), PH(p) the
 * placeholder of pod p (Owner::Placeholder; the pod's group). Owners of one
 * group share a device (Owner::SameGroup); owners of two groups never do. */
#define STEP(j)  (1 << (j))
#define JOB(j)   (1 << (NJ + (j)))
#define PH(p)    (1 << (2 * NJ + (p)))
#define GJ(j)    (STEP(j) | JOB(j))
#define GP(p)    (PH(p))
#define ALLPODS  (((1 << NP) - 1) << (2 * NJ))
#define ALLBITS  ((1 << (2 * NJ + NP)) - 1)

/* Slurm job ids in slurmctld's allocation table: job j is j+1, the
 * placeholder job of pod p is PHID(p); 0 is a free device. */
#define JOBID(j) ((j) + 1)
#define PHID(p)  (NJ + 1 + (p))

/* ---- slurmctld (persistent) --------------------------------------------- */
byte sl[ND];          /* cons_tres: the one job each device is allocated to */
byte jd[NJ];          /* the device Slurm gave job j */
bit  lost[NP];        /* pod p's placeholder was cancelled by an admin, not yet repaired */

/* ---- Kubernetes (persistent) ---------------------------------------------- */
mtype:phase = { P_NONE, P_PENDING, P_BOUND, P_RUNNING, P_TERMINATING, P_GONE };
mtype:phase kp[NP];   /* the pod's state in the API server (+ kubelet) */

/* ---- what runs on the devices (the ground truth I1 is judged against) ---- */
byte srun[NJ];        /* d+1 while job j's step's tasks run on device d */
byte prun[NP];        /* d+1 while pod p's container runs on device d */

/* ---- duet-bridge ---------------------------------------------------------- */
#define DOWN       0
#define RECOVERING 1  /* journal restored, first Slurm sync pass not done */
#define SERVING    2
byte up = SERVING;
byte epoch;           /* bumped by every crash: in-flight work of the old process dies */
byte led[ND];         /* the ledger (volatile): owners holding each device */
byte jrn[ND];         /* the journal (durable): the ledger as of the last fsync */

/* The pod watch's view (volatile). V_UNSEEN: not listed yet, or not in the
 * last list (PodLiveness kUnknown); V_LIVE: kLive; V_ENDED: kGone. */
#define V_UNSEEN 0
#define V_LIVE   1
#define V_ENDED  2
byte view[NP];
bit  synced;          /* the watch has listed since the bridge started */
bit  pend[NP];        /* a release of pod p's holdings is queued (PodWatch::pending_) */

/* Invariant bookkeeping: owners whose grant was answered to a caller and not
 * released since (I3), and a reconcile pass's verdict (I2c). */
byte granted;
bit  i2c_bad;
byte binding[NP];     /* bind handlers working on pod p */

byte crashes, scancels;

/* ---- the bridge's RPC channels (lossy; emptied by a crash) --------------- */
mtype:rpc = { HOLD, REL_STEP, REL_JOB };
chan hreq[NJ] = [2] of { mtype:rpc };    /* spank_duet -> LedgerService */
chan breq = [MAXBIND * NP] of { byte };   /* kube-scheduler -> extender bind */
#define A_NONE    0
#define A_OK      1
#define A_REFUSED 2
byte jans[NJ];        /* LedgerService's answer to job j's Hold, if it arrives */

/* ---- helpers --------------------------------------------------------------- */

/* Ledger::Hold of owner o (group mask g) on device d: refused when another
 * group holds d; a repeat of an existing holding succeeds unchanged. */
inline ledger_hold(o, g, d, ok) {
  if
  :: (led[d] & (o)) -> ok = 1
  :: else ->
     if
     :: (led[d] & (ALLBITS & ~(g))) -> ok = 0
     :: else -> led[d] = led[d] | (o); ok = 1
     fi
  fi
}

/* Ledger::Release of owner o, wherever it holds. */
inline ledger_release(o) {
  led[0] = led[0] & (ALLBITS & ~(o));
  led[1] = led[1] & (ALLBITS & ~(o));
  granted = granted & (ALLBITS & ~(o))
}

#define HELD(o)     ((led[0] & (o)) || (led[1] & (o)))
#define JOURNALED(o) ((jrn[0] & (o)) || (jrn[1] & (o)))
/* Journal::WaitDurable for the change that touched o: the journal agrees
 * with the ledger about o (group commit writes the whole buffer). */
#define DURABLE(o)  ((jrn[0] & (o)) == (led[0] & (o)) && (jrn[1] & (o)) == (led[1] & (o)))
#define ALL_DURABLE (jrn[0] == led[0] && jrn[1] == led[1])

/* slurmctld: is job id x allocated anywhere (running)? */
#define SLURM_RUNS(x) (sl[0] == (x) || sl[1] == (x))

/* SlurmSync::PodOf / StaleHolders' pod_liveness: the pod watch's view. */
#define POD_GONE(p) (view[p] == V_ENDED)


/* What a watch event makes of the API server's pod (PodWatch::OnUpsert /
 * OnDelete): deleted or terminal is ended; anything else bound or pending is
 * live. The safeguard: a pod being deleted still runs until kubelet has
 * stopped it, and Kubernetes deletes the object (the DELETED event) only
 * then. */
#ifdef BUG_RELEASE_ON_TERMINATING
#define EVENT_VIEW(p) (kp[p] == P_GONE || kp[p] == P_TERMINATING -> V_ENDED : \
                       (kp[p] == P_NONE -> V_UNSEEN : V_LIVE))
#else
#define EVENT_VIEW(p) (kp[p] == P_GONE -> V_ENDED : (kp[p] == P_NONE -> V_UNSEEN : V_LIVE))
#endif
/* What a full list makes of it: a pod not in the list is not seen. */
#define LIST_VIEW(p) (kp[p] == P_GONE || kp[p] == P_NONE -> V_UNSEEN : V_LIVE)

/* ===========================================================================
 * A Slurm job with one step: slurmctld's cons_tres allocation, slurmstepd
 * with spank_duet (RemoteUserInit registers before the task starts,
 * RemoteExit releases at step end), the job's end.
 * ======================================================================== */
proctype Job(byte j) {
  byte d;
  /* sbatch: cons_tres allocates one free device (any free one); then
   * slurmstepd's user_init sends Hold(step) on a fresh channel, lost on the
   * way when the bridge is down or the call is dropped. */
end_queued:
  atomic {
    if
    :: sl[0] == 0 -> d = 0
    :: sl[1] == 0 -> d = 1
    fi;
    sl[d] = JOBID(j);
    jd[j] = d;
    jans[j] = A_NONE;
    if
    :: up == SERVING -> hreq[j]!HOLD
    :: true                            /* lost */
    fi
  };
  if
  :: atomic { jans[j] == A_OK -> srun[j] = d + 1 };   /* registered: the tasks run */
     /* The tasks end; RemoteExit sends ReleaseStep, then (batch step)
      * ReleaseJob, each of which may be lost: job import releases what
      * remains once Slurm says the job has ended. */
     atomic {
       srun[j] = 0;
       if
       :: up == SERVING -> hreq[j]!REL_STEP
       :: true
       fi;
       if
       :: up == SERVING -> hreq[j]!REL_JOB
       :: true
       fi
     }
  :: true         /* refused, or the deadline passed first (on_unreachable=fail) */
  fi;
  atomic { sl[d] = 0; d = 0; jans[j] = A_NONE }   /* the job ends in Slurm */
}

/* ===========================================================================
 * A pod: created, scheduled by kube-scheduler through the extender (bind
 * attempts, retried while the pod is unbound), started by kubelet with its
 * placeholder's devices (duet-node Allocate), deleted by its owner, stopped
 * by kubelet.
 * ======================================================================== */
proctype Pod(byte p) {
  byte attempts, d;
  do
  :: atomic {
       kp[p] == P_PENDING && attempts < MAXBIND ->
       attempts++;
       if
       :: up == SERVING -> binding[p]++; breq!p
       :: true                         /* the bind call is lost */
       fi
     }
  :: atomic {
       kp[p] == P_BOUND && up == SERVING && HELD(PH(p)) ->
       /* duet-node Allocate: the container gets the devices the ledger
        * shows for the pod's placeholder. */
       if
       :: led[0] & PH(p) -> d = 0
       :: led[1] & PH(p) -> d = 1
       fi;
       prun[p] = d + 1;
       kp[p] = P_RUNNING
     }
  :: atomic { kp[p] == P_PENDING || kp[p] == P_BOUND -> kp[p] = P_GONE; break }  /* deleted before it ran */
  :: atomic { kp[p] == P_RUNNING -> kp[p] = P_TERMINATING };  /* deletion asked: it still runs */
     atomic { prun[p] = 0; kp[p] = P_GONE; break }  /* kubelet stopped it; the object is deleted */
  od;
  atomic { attempts = 0; d = 0 }
}

/* ===========================================================================
 * duet-bridge, LedgerService::Hold / Release for spank_duet (one gRPC
 * handler per job: calls of different jobs run concurrently). Hold applies
 * the grant under the ledger's lock, resolves stale Slurm holders
 * (StaleHolders::ReleaseEnded) and answers when the grant is durable.
 * ======================================================================== */
/* A handler's locals back at rest when a call is done: fewer states. */
#define RPC_REST d = 0; k = 0; ep = 0; ok = 0; m = HOLD

proctype Rpc(byte j) {
  mtype:rpc m;
  byte ep, d, k;
  bit ok;
end_idle:
rpc_idle:
  do
  :: atomic {
       up == SERVING && hreq[j]?[m] ->
       hreq[j]?m;
       ep = epoch;
       d = jd[j];
       if
       :: m == REL_STEP -> ledger_release(STEP(j)); RPC_REST; goto rpc_idle
       :: m == REL_JOB -> ledger_release(JOB(j)); RPC_REST; goto rpc_idle
       :: m == HOLD
       fi;
#ifdef BUG_NO_FENCE
       /* the pods' holdings are not consulted */
       ledger_hold(STEP(j), GJ(j) | ALLPODS, d, ok);
#else
       ledger_hold(STEP(j), GJ(j), d, ok);
#endif
       if
       :: !ok ->
          /* StaleHolders::ReleaseEnded: Slurm-side holders of d whose Slurm
           * job has ended are released (a placeholder only once its pod is
           * known gone), then the Hold is tried once more. */
          k = 0;
          do
          :: k < NJ ->
             if
             :: k != j && (led[d] & GJ(k)) && !SLURM_RUNS(JOBID(k)) -> ledger_release(GJ(k))
             :: else
             fi;
             k++
          :: else -> break
          od;
          k = 0;
          do
          :: k < NP ->
             if
#ifdef BUG_STALE_NO_LIVENESS
             :: (led[d] & PH(k)) && !SLURM_RUNS(PHID(k)) -> ledger_release(PH(k))
#else
             :: (led[d] & PH(k)) && !SLURM_RUNS(PHID(k)) && POD_GONE(k) -> ledger_release(PH(k))
#endif
             :: else
             fi;
             k++
          :: else -> break
          od;
          ledger_hold(STEP(j), GJ(j), d, ok)
       :: else
       fi;
       if
       :: !ok ->
          if
          :: jans[j] = A_REFUSED
          :: skip                      /* the answer is lost */
          fi;
          RPC_REST;
          goto rpc_idle
       :: else
       fi
     };
     /* AnswerWhenDurable (BUG_EARLY_ANSWER: answered at once). */
     if
#ifdef BUG_EARLY_ANSWER
     :: atomic {
          epoch == ep ->
#else
     :: atomic {
          epoch == ep && DURABLE(STEP(j)) ->
#endif
          granted = granted | (STEP(j) & (led[0] | led[1]));
          if
          :: jans[j] = A_OK
          :: skip                      /* the answer is lost */
          fi;
          RPC_REST
        }
     :: atomic { epoch != ep -> RPC_REST }
     fi
  od
}

/* ===========================================================================
 * duet-bridge, Extender::Bind with pods::PodHolds::HoldWithSlurm and
 * Placeholders::Create: GetPod, the placeholder in Slurm (immediate), the
 * ledger's record of Slurm's devices, the wait for durability, the Binding
 * POST, the rollback (Placeholders::Cancel) when the POST fails.
 * ======================================================================== */
#define BIND_REST binding[p]--; p = 0; d = 0; ep = 0; ok = 0; reuse = 0

proctype Bind() {
  byte p, d, ep;
  bit ok, reuse;
end_idle:
bind_idle:
  do
  :: atomic {
       up == SERVING && breq?[p] ->
       breq?p;
       ep = epoch;
       /* GetPod: an attempt for a pod already bound (an earlier attempt's
        * answer was lost) succeeds; one for a pod that is gone is refused. */
       if
       :: kp[p] != P_PENDING -> BIND_REST; goto bind_idle
       :: else
       fi;
       /* PodHolds::Hold: a holding from an earlier attempt is reused. */
       if
       :: HELD(PH(p)) -> reuse = 1
       :: else ->
          /* Placeholders::Create: slurmctld allocates (immediate) or refuses. */
          if
          :: sl[0] == 0 -> d = 0
          :: sl[1] == 0 -> d = 1
          :: else -> BIND_REST; goto bind_idle
          fi;
          sl[d] = PHID(p)
       fi
     };
     /* The ledger records the devices Slurm chose; refused: the job is killed. */
     if
     :: reuse
     :: atomic {
          !reuse && epoch == ep ->
          ledger_hold(PH(p), GP(p), d, ok);
          if
          :: !ok -> if :: sl[d] == PHID(p) -> sl[d] = 0 :: else fi; BIND_REST; goto bind_idle
          :: else
          fi
        }
     :: atomic { !reuse && epoch != ep -> BIND_REST; goto bind_idle }
     fi;
     /* Extender::Hold waits for durability (a reused holding: for every
      * change so far), then Bind POSTs the Binding; BUG_EARLY_ANSWER: no
      * wait. A POST for a pod that is gone fails, and the bind rolls back;
      * one for a pod already bound (to the one node) succeeds. */
     if
     :: atomic {
#ifdef BUG_EARLY_ANSWER
          epoch == ep ->
#else
          epoch == ep && ((reuse && ALL_DURABLE) || (!reuse && DURABLE(PH(p)))) ->
#endif
          if
          :: kp[p] == P_PENDING -> kp[p] = P_BOUND; granted = granted | (PH(p) & (led[0] | led[1])); BIND_REST; goto bind_idle
          :: kp[p] != P_PENDING && kp[p] != P_GONE ->
             /* 409, and GetPod shows it bound to this node (another
              * attempt bound it): success, nothing rolled back. */
             BIND_REST; goto bind_idle
          :: else
          fi
        }
     :: atomic { epoch != ep -> BIND_REST; goto bind_idle }
     fi;
     /* Rollback = Placeholders::Cancel: kill the Slurm job, then release. */
     if
     :: atomic {
          epoch == ep ->
          if
          :: sl[0] == PHID(p) && (led[0] & PH(p)) -> sl[0] = 0
          :: else
          fi;
          if
          :: sl[1] == PHID(p) && (led[1] & PH(p)) -> sl[1] = 0
          :: else
          fi
        }
     :: atomic { epoch != ep -> BIND_REST; goto bind_idle }
     fi;
     if
     :: atomic { epoch == ep -> ledger_release(PH(p)); BIND_REST }
     :: atomic { epoch != ep -> BIND_REST }
     fi
  od
}

/* ===========================================================================
 * duet-bridge, k8s::PodWatch with BridgePodReleaser: events (deleted or
 * terminal pods queue a release), full lists (with the sweep of holdings
 * whose pod is not listed), and the release itself, Placeholders::Cancel:
 * kill the placeholder job in Slurm, then release the ledger.
 * ======================================================================== */
/* A watch event for pod p: the view follows the API server; a pod that
 * ended queues the release of its holdings. */
inline watch_event(p) {
  view[p] = EVENT_VIEW(p);
  if
  :: view[p] == V_ENDED -> pend[p] = 1
  :: else
  fi
}

/* An event is due when the API server's pod differs from the view, except
 * for a pod that is gone and that the last list did not show (no event
 * follows for it). */
#define WATCH_EVENT(p) (EVENT_VIEW(p) != view[p] && !(kp[p] == P_GONE && view[p] == V_UNSEEN))

#define SWEEP_DUE(p) (view[p] == V_UNSEEN && kp[p] == P_GONE && HELD(PH(p)) && !pend[p])

proctype PodWatch() {
  byte p, ep;
  bit had;
end_idle:
  do
  :: atomic { up == SERVING && synced && WATCH_EVENT(0) -> watch_event(0) }
  :: atomic { up == SERVING && synced && NP > 1 && WATCH_EVENT(NP - 1) -> watch_event(NP - 1) }
  :: d_step {
       up == SERVING && (!synced || RELIST) ->
       /* a full list (the first after a start; with RELIST also again, as
        * after a failed watch), then the sweep */
       synced = 1;
       p = 0;
       do
       :: p < NP ->
          view[p] = LIST_VIEW(p);
          if
          :: view[p] == V_UNSEEN && HELD(PH(p)) -> pend[p] = 1
          :: else
          fi;
          p++
       :: else -> break
       od;
       p = 0
     }
  /* The periodic sweep on the current view: holdings of pods the view
   * does not know are released (the grace keeps it from a pod that exists). */
  :: atomic { up == SERVING && synced && SWEEP_DUE(0) -> pend[0] = 1 }
  :: atomic { up == SERVING && synced && NP > 1 && SWEEP_DUE(NP - 1) -> pend[NP - 1] = 1 }
  :: atomic {
       up == SERVING && (pend[0] || pend[NP - 1]) ->
       ep = epoch;
       if
       :: pend[0] -> p = 0
       :: pend[NP - 1] -> p = NP - 1
       fi;
       /* ReleasePending -> BridgePodReleaser -> Placeholders::Cancel: for
        * each placeholder holding of the pod the ledger lists now, kill its
        * Slurm job, then release it. */
       had = HELD(PH(p));
       if
       :: (led[0] & PH(p)) && sl[0] == PHID(p) -> sl[0] = 0
       :: else
       fi;
       if
       :: (led[1] & PH(p)) && sl[1] == PHID(p) -> sl[1] = 0
       :: else
       fi
     };
     if
     :: atomic {
          epoch == ep ->
          if
          :: had -> ledger_release(PH(p))
          :: else
          fi;
          pend[p] = 0;
          /* Released: a deleted pod is forgotten (Lookup: not seen). */
          if
          :: kp[p] == P_GONE -> view[p] = V_UNSEEN
          :: else
          fi;
          p = 0; ep = 0; had = 0
        }
     :: atomic { epoch != ep -> p = 0; ep = 0; had = 0 }
     fi
  od
}

/* ===========================================================================
 * duet-bridge, SlurmSync::RunOnce / ImportJobs, every period and once
 * before serving after a start: list Slurm's jobs; release holdings granted
 * before the list whose Slurm job no longer runs (a lost placeholder of a
 * pod not known gone is kept and repaired: HandleLost / Placeholders::
 * Repair); cancel placeholders of gone pods; import live jobs the ledger
 * lacks.
 * ======================================================================== */
#ifdef I2C_AT_LIST
/* I2's reconcile clause for pods known gone when the pass listed (stricter:
 * see model/README.md, "What the model found"). */
#define I2C_GONE(k) (gone_at_list & PH(k))
#define SYNC_REST ep = 0; d = 0; k = 0; ok = 0; lsl[0] = 0; lsl[1] = 0; snap[0] = 0; snap[1] = 0; \
                  gone_at_list = 0
#else
/* I2's reconcile clause for pods the pass knows are gone when it ends. */
#define I2C_GONE(k) POD_GONE(k)
#define SYNC_REST ep = 0; d = 0; k = 0; ok = 0; lsl[0] = 0; lsl[1] = 0; snap[0] = 0; snap[1] = 0
#endif

proctype Sync() {
  byte ep, d, k, lsl[ND], snap[ND];
  bit ok;
#ifdef I2C_AT_LIST
  byte gone_at_list;   /* PH bits of pods known gone when the pass listed */
#endif
end_idle:
  do
  :: d_step {
       up != DOWN ->
       ep = epoch;
       lsl[0] = sl[0]; lsl[1] = sl[1];
       snap[0] = led[0]; snap[1] = led[1];
#ifdef I2C_AT_LIST
       gone_at_list = (POD_GONE(0) -> PH(0) : 0) | (POD_GONE(NP - 1) -> PH(NP - 1) : 0)
#else
       skip
#endif
     };
     /* Then, in one step: release holdings granted before the list whose
      * Slurm job the list does not show (a lost placeholder of a pod not
      * known gone is kept and repaired: HandleLost / Placeholders::Repair),
      * cancel placeholders of gone pods, import listed jobs the ledger
      * lacks; at the end of a complete pass, I2's reconcile clause. */
     if
     :: d_step {
          epoch == ep ->
          d = 0;
          do
          :: d < ND ->
             k = 0;
             do
             :: k < NJ ->
                if
                :: (snap[d] & led[d] & GJ(k)) && lsl[0] != JOBID(k) && lsl[1] != JOBID(k) ->
                   ledger_release(GJ(k))
                :: else
                fi;
                k++
             :: else -> break
             od;
             k = 0;
             do
             :: k < NP ->
                if
                :: (snap[d] & led[d] & PH(k)) && lsl[0] != PHID(k) && lsl[1] != PHID(k) ->
#ifdef BUG_SYNC_NO_LIVENESS
                   ledger_release(PH(k))
#else
                   if
                   :: POD_GONE(k) -> ledger_release(PH(k))
                   :: else ->
                      /* Repair: the placeholder again on exactly d when
                       * Slurm has d free; else the devices stay fenced. */
                      if
                      :: sl[d] == 0 -> sl[d] = PHID(k); lost[k] = 0
                      :: else
                      fi
                   fi
#endif
                :: else
                fi;
                k++
             :: else -> break
             od;
             d++
          :: else -> break
          od;
          d = 0;
          do
          :: d < ND ->
             k = 0;
             do
             :: k < NJ ->
                if
                :: lsl[d] == JOBID(k) && !HELD(JOB(k)) -> ledger_hold(JOB(k), GJ(k), d, ok)
                :: else
                fi;
                k++
             :: else -> break
             od;
             k = 0;
             do
             :: k < NP ->
                if
                :: lsl[d] == PHID(k) && POD_GONE(k) ->
                   if
                   :: sl[d] == PHID(k) -> sl[d] = 0
                   :: else
                   fi;
                   ledger_release(PH(k))
                :: lsl[d] == PHID(k) && !POD_GONE(k) && !HELD(PH(k)) ->
                   ledger_hold(PH(k), GP(k), d, ok)
                :: else
                fi;
                k++
             :: else -> break
             od;
             d++
          :: else -> break
          od;
          k = 0;
          do
          :: k < NP ->
             if
             :: I2C_GONE(k) && binding[k] == 0 && !pend[k] &&
                (SLURM_RUNS(PHID(k)) || HELD(PH(k))) -> i2c_bad = 1
             :: else
             fi;
             k++
          :: else -> break
          od;
          if
          :: up == RECOVERING -> up = SERVING
          :: else
          fi;
          SYNC_REST
        }
     :: atomic { epoch != ep -> SYNC_REST }
     fi
  od
}


/* ===========================================================================
 * duet-bridge's journal writer (group commit): the ledger's changes so far
 * become durable at once.
 * ======================================================================== */
active proctype Journal() {
end_idle:
  do
  :: atomic { up != DOWN && (jrn[0] != led[0] || jrn[1] != led[1]) -> jrn[0] = led[0]; jrn[1] = led[1] }
  od
}

/* ===========================================================================
 * The environment: duet-bridge crashes (volatile state and in-flight calls
 * lost) and restarts (the ledger from the journal; serving after the first
 * sync pass); an admin cancels a placeholder job in Slurm.
 * ======================================================================== */
active proctype Env() {
  byte p;
end_idle:
  do
  :: atomic {
       up == SERVING && crashes < MAXCRASH ->
       crashes++;
       up = DOWN;
       epoch++;
       led[0] = 0; led[1] = 0;
       synced = 0;
       p = 0;
       do
       :: p < NP -> view[p] = V_UNSEEN; pend[p] = 0; p++
       :: else -> break
       od;
       p = 0;
       do
       :: p < NJ -> do :: hreq[p]?[_] -> hreq[p]?_ :: else -> break od; p++
       :: else -> break
       od;
       do
       :: breq?[p] -> breq?p; binding[p]--
       :: else -> break
       od;
       p = 0
     }
  :: atomic { up == DOWN -> led[0] = jrn[0]; led[1] = jrn[1]; up = RECOVERING }
  :: atomic {
       scancels < MAXSCANCEL && (sl[0] >= PHID(0) || sl[1] >= PHID(0)) ->
       if
       :: sl[0] >= PHID(0) -> p = sl[0] - PHID(0); sl[0] = 0
       :: sl[1] >= PHID(0) -> p = sl[1] - PHID(0); sl[1] = 0
       fi;
       lost[p] = 1;
       scancels++;
       p = 0
     }
  od
}

/* ===========================================================================
 * The invariants, checked in every reachable state.
 * ======================================================================== */

/* I1: no device is used by two owners: a step's tasks and a pod's
 * container, two pods, or two jobs' steps. And the ledger itself never
 * records two groups on one device. */
#define RUN_CLASH(a, b) ((a) != 0 && (a) == (b))
#define LEDGER_ONE_GROUP(d) \
  (!((led[d] & GJ(0)) && (led[d] & (ALLBITS & ~GJ(0)))) && \
   !((led[d] & GJ(NJ - 1)) && (led[d] & (ALLBITS & ~GJ(NJ - 1)))) && \
   !((led[d] & PH(0)) && (led[d] & (ALLBITS & ~PH(0)))))
#define I1 \
  (!RUN_CLASH(srun[0], prun[0]) && !RUN_CLASH(srun[NJ - 1], prun[0]) && \
   !RUN_CLASH(srun[0], prun[NP - 1]) && !RUN_CLASH(srun[NJ - 1], prun[NP - 1]) && \
   (NJ == 1 || !RUN_CLASH(srun[0], srun[NJ - 1])) && \
   (NP == 1 || !RUN_CLASH(prun[0], prun[NP - 1])) && \
   LEDGER_ONE_GROUP(0) && LEDGER_ONE_GROUP(1))

#ifndef NO_I1
active proctype CheckI1() {
end_watch:
  atomic { !I1 -> assert(I1) }
}
#endif

/* I2 (model/README.md): (a) while the bridge is up, a running pod's device
 * is held in the ledger by the pod's group; (b) a running pod's device is
 * covered in Slurm by its placeholder, or fenced by the ledger or journal;
 * (c) a complete reconcile pass leaves no placeholder (Slurm or ledger) of a
 * pod it knows has ended, unless its release is queued or a bind of it is in
 * flight (i2c_bad, set by Sync). */
#ifdef I2_STRICT
/* Also: no other device is held for the pod, and Slurm lacks the
 * placeholder only after an admin cancelled it (model/README.md, "What the
 * model found", shows why the code does not meet this). */
#define I2_ONLY(p)  !(led[2 - prun[p]] & PH(p))
#define I2_FENCE(p) lost[p]
#else
#define I2_ONLY(p)  1
#define I2_FENCE(p) ((led[prun[p] - 1] | jrn[prun[p] - 1]) & PH(p))
#endif
#define I2_POD(p) \
  (prun[p] == 0 || \
   ((up == DOWN || ((led[prun[p] - 1] & PH(p)) && I2_ONLY(p))) && \
    (sl[prun[p] - 1] == PHID(p) || I2_FENCE(p))))
#define I2 (I2_POD(0) && I2_POD(NP - 1) && !i2c_bad)

#ifndef NO_I2
active proctype CheckI2() {
end_watch:
  atomic { !I2 -> assert(I2) }
}
#endif

/* I3: a holding answered to its caller (a step's Hold, a pod's Binding) is
 * in the journal until it is released. */
#define I3_OWNER(o) (!(granted & (o)) || JOURNALED(o))
#define I3 (I3_OWNER(STEP(0)) && I3_OWNER(STEP(NJ - 1)) && I3_OWNER(PH(0)) && I3_OWNER(PH(NP - 1)))

#ifndef NO_I3
active proctype CheckI3() {
end_watch:
  atomic { !I3 -> assert(I3) }
}
#endif

init {
  byte i;
  atomic {
    i = 0;
    do
    :: i < NJ -> run Job(i); run Rpc(i); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NP -> kp[i] = P_PENDING; run Pod(i); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < BIND_HANDLERS -> run Bind(); i++
    :: else -> break
    od;
    run PodWatch();
    run Sync()
  }
}
