/* duet's DRA lending mode (docs/dra.md) as a Promela model, checked by spin.
 *
 * One shared node of a lending pool with ND = 2 devices. Slurm jobs take
 * free devices through slurmctld's allocator; duet's Lender lends devices to
 * Kubernetes (a placeholder "lend" job in Slurm, the ledger's Lend holding,
 * the DeviceTaintRule deleted) and reclaims them (flag, taint, wait out
 * admissions in flight, quorum LIST of claims, cancel the lend job);
 * kube-scheduler allocates a ResourceClaim from a stale cache, picking the
 * device in Filter and writing status.allocation in PreBind, any time later;
 * the apiserver checks the claim's resourceVersion, calls duet's validating
 * webhook on resourceclaims/status and stores the write only if it was
 * allowed and no other write came first; the claim's pods run on the
 * allocated device and the resourceclaim controller deallocates the claim
 * when a pod ends; duet-bridge moves a deallocated claim's devices back to
 * lent, free from its claim watch, through a fence like reclaim's (flag the
 * claim's holding releasing, wait out its admissions in flight, quorum read
 * of the claim: Lender::ReleaseClaimIfDeallocated). model/README.md ("DRA
 * lending") maps each process to the code and lists what is abstracted
 * away.
 *
 * Compile-time switches (spin -DNAME=VALUE):
 *   NC         claims (1 or 2; default 1)
 *   NTOL       claims 0..NTOL-1 tolerate duet's taint, the others respect
 *              it (default 1: claim 0 ignores taints; they fence nothing)
 *   RUNS       pods that use claim 0 one after another (default 2: the
 *              claim is deallocated and allocated again); claim 1 has one
 *   MAXLEND    lend operations in all (default 2)
 *   MAXBUMP    other writes of claim 0 (metadata: the resourceVersion
 *              moves, the allocation does not; default 1)
 *   NO_I1      leave I1's monitor out
 *   I2         check I2 as well (CheckI2; the contract as written breaks it)
 * Mutations, each removing one safeguard of the contract (all break I1):
 *   BUG_NO_WEBHOOK            the webhook allows every allocation
 *   BUG_RECLAIM_BEFORE_LIST   reclaim cancels the lend job right after the
 *                             taint: no wait for admissions, no LIST
 *   BUG_NO_FLAG               reclaim taints without flagging reclaiming
 *   BUG_NO_ADMISSION_WAIT     reclaim LISTs without waiting out admissions
 *                             in flight
 *   BUG_DEALLOC_UNFENCED      the deallocation as docs/dra.md first had it:
 *                             a claim's holding goes back to Lend on its
 *                             deallocation event, no fence (ClaimWatch);
 *                             breaks I1 with NC=2 (model/README.md, finding
 *                             1), and is what BUG_RECLAIM_BEFORE_LIST and
 *                             BUG_NO_ADMISSION_WAIT need to show their race
 */

#define ND 2
#ifndef NC
#define NC 1
#endif
#ifndef NTOL
#define NTOL 1
#endif
#ifndef RUNS
#define RUNS 2
#endif
#ifndef MAXLEND
#define MAXLEND 2
#endif
#ifndef MAXBUMP
#define MAXBUMP 1
#endif

/* ---- slurmctld ------------------------------------------------------------
 * cons_tres's allocation table: the job each device is allocated to. 0 is
 * free; job j is JOBID(j); LENDJ is the lend job of that device (one lend
 * job per lent device, so a reclaim cancels exactly one device's job). */
#define JOBID(j) ((j) + 1)
#define LENDJ    9
byte sl[ND];

/* ---- the ledger (duet-bridge) ---------------------------------------------
 * L_NONE: not lent (free, or held by a Slurm job: the model does not
 * record Slurm's own holdings); L_LEND: held by the device's lend owner
 * (lent, free); L_CLAIM(c): held by claim c (allocated). rec: the
 * in-memory reclaiming flag. */
#define L_NONE     0
#define L_LEND     1
#define L_CLAIM(c) (2 + (c))
byte led[ND];
bit  rec[ND];
#ifndef BUG_DEALLOC_UNFENCED
bit  rel[ND];         /* a claim's holding being released */
#define RELEASING(d) rel[d]
#else
#define RELEASING(d) 0
#endif

/* ---- Kubernetes -------------------------------------------------------------
 * taint: the device's DeviceTaintRule exists (every device starts not lent,
 * so tainted). alloc[c]: d+1 while claim c's status.allocation names device
 * d (etcd, what a quorum read returns); rv[c]: its resourceVersion.
 * infl[c]: d+1 while a write of claim c's allocation naming d has been
 * allowed by the webhook and not yet stored or dropped by the apiserver (an
 * admission in flight). */
bit  taint[ND];
byte alloc[NC];
byte rv[NC];
byte infl[NC];

/* The claim watch (duet-bridge): deallocations of claim c, in etcd's order,
 * delivered any time later. */
chan cw = [RUNS + NC - 1] of { byte };

/* The pods of claim c, one after another (Pods): pending (its claim to be
 * allocated), running, ended (the claim still allocated), done. */
#define PD_PENDING 0
#define PD_RUNNING 1
#define PD_ENDED   2
#define PD_DONE    3
byte pod[NC];

/* ---- what runs on the devices (the ground truth I1 is judged against) ---- */
#define NJ 1
byte srun[NJ];        /* d+1 while job j's step runs on device d */
byte prun[NC];        /* d+1 while a pod of claim c runs on device d */

/* ---- kube-scheduler's cache (an informer's view, refreshed any time) ---- */
bit  ctaint[ND];
byte calloc[NC];
byte crv[NC];

#define TOLERATES(c) ((c) < NTOL)
#define ANY_ALLOC(d) (alloc[0] == (d) + 1 || alloc[NC - 1] == (d) + 1)
#define ANY_INFL(d)  (infl[0] == (d) + 1 || infl[NC - 1] == (d) + 1)

/* ===========================================================================
 * A Slurm job: sbatch, cons_tres allocates a free device (never one a lend
 * job holds), the step runs on it, the step and the job end.
 * ======================================================================== */
proctype Job(byte j) {
  byte d;
  atomic {
    if
    :: sl[0] == 0 -> d = 0
    :: sl[1] == 0 -> d = 1
    fi;
    sl[d] = JOBID(j)
  };
  srun[j] = d + 1;                     /* the step's tasks run */
  srun[j] = 0;
  atomic { sl[d] = 0; d = 0 }          /* the job ends */
}

/* ===========================================================================
 * duet-bridge's Lender: lend a device (Slurm picks which), reclaim a lent,
 * free one (docs/dra.md, "Reclaim", steps 1-5). One operation at a time.
 * ======================================================================== */
proctype Lender() {
  byte d, lends;
end_idle:
  do
  :: atomic {
       /* Lend: the placeholder lend job is submitted; slurmctld allocates
        * a free device of its choice (immediate) */
       lends < MAXLEND && (sl[0] == 0 || sl[1] == 0) ->
       lends++;
       if
       :: sl[0] == 0 -> d = 0
       :: sl[1] == 0 -> d = 1
       fi;
       sl[d] = LENDJ
     };
     led[d] = L_LEND;                  /* the ledger records Lend(J, node), durable */
     atomic { taint[d] = 0; d = 0 }    /* its DeviceTaintRule is deleted */
  :: atomic {
       /* Reclaim (1): a lent, free device, under the ledger's lock: flag
        * it reclaiming, so the webhook refuses it */
       (led[0] == L_LEND && !rec[0]) || (led[1] == L_LEND && !rec[1]) ->
       if
       :: led[0] == L_LEND && !rec[0] -> d = 0
       :: led[1] == L_LEND && !rec[1] -> d = 1
       fi;
#ifndef BUG_NO_FLAG
       rec[d] = 1
#else
       skip
#endif
     };
     taint[d] = 1;                     /* (2) the DeviceTaintRule is created */
#ifndef BUG_RECLAIM_BEFORE_LIST
     /* (3) wait out admissions in flight: every write the webhook allowed
      * for d has been stored or dropped by the apiserver */
#ifndef BUG_NO_ADMISSION_WAIT
     !ANY_INFL(d);
#endif
     /* (4) a quorum LIST of claims: one that allocates d aborts the
      * reclaim (un-flag; d stays lent, so its rule goes again) */
     if
     :: atomic { ANY_ALLOC(d) -> rec[d] = 0; taint[d] = 0; d = 0 }
     :: else ->
#endif
        /* (5) cancel the lend job: Slurm frees d; the Lend holding is
         * released */
        atomic {
          sl[d] = 0;
          if
          :: led[d] == L_LEND -> led[d] = L_NONE
          :: else
          fi;
          rec[d] = 0;
          d = 0
        }
#ifndef BUG_RECLAIM_BEFORE_LIST
     fi
#endif
  od
}

/* ===========================================================================
 * duet's validating admission webhook on resourceclaims/status, called by
 * the apiserver for a new allocation of claim c naming device d; under the
 * ledger's lock. Allowed: d is lent, free and not reclaiming (moved to the
 * claim in the same step: Ledger::Rebind), or the claim holds it already.
 * ======================================================================== */
inline webhook(c, d, ok) {
#ifdef BUG_NO_WEBHOOK
  ok = 1
#else
  if
  :: led[d] == L_LEND && !rec[d] -> led[d] = L_CLAIM(c); ok = 1
  :: led[d] == L_CLAIM(c) && !RELEASING(d) -> ok = 1
  :: else -> ok = 0
  fi
#endif
}

/* ===========================================================================
 * kube-scheduler's DynamicResources plugin for claim c, on its cache:
 * Filter picks a device (free in the cache; untainted in the cache unless
 * the claim tolerates duet's taint) and remembers the claim's
 * resourceVersion; PreBind, any time later, writes status.allocation. The
 * apiserver: a stale resourceVersion is a conflict; else the webhook; an
 * allowed write is in flight until the apiserver stores it, which fails if
 * another write of the claim came first. Denied or conflicting: Filter
 * again (once the cache has moved on). The informer refreshes the cache.
 * ======================================================================== */
#define S_IDLE    0
#define S_PICKED  1   /* Filter chose d; PreBind has not written yet */
#define S_ALLOWED 2   /* the webhook allowed; the apiserver has not stored */

/* Filter, in the cache: device d is not another claim's, and is untainted
 * unless claim c tolerates duet's taint. No device fits: the pod stays
 * pending. */
#define FITS(c, d) ((TOLERATES(c) || !ctaint[d]) && !(NC > 1 && calloc[1 - (c)] == (d) + 1))

proctype Scheduler(byte c) {
  byte d, prv, stage;
  bit ok;
end_idle:
  do
  :: atomic {
       /* Filter (the pod is pending: its claim unallocated in the cache) */
       stage == S_IDLE && pod[c] == PD_PENDING && calloc[c] == 0 && (FITS(c, 0) || FITS(c, 1)) ->
       if
       :: FITS(c, 0) -> d = 0
       :: FITS(c, 1) -> d = 1
       fi;
       prv = crv[c];
       stage = S_PICKED
     }
  :: atomic {
       /* PreBind's write reaches the apiserver */
       stage == S_PICKED ->
       if
       :: rv[c] != prv -> stage = S_IDLE; d = 0; prv = 0        /* 409 */
       :: else ->
          webhook(c, d, ok);
          if
          :: ok -> infl[c] = d + 1; stage = S_ALLOWED
          :: else -> stage = S_IDLE; d = 0; prv = 0             /* denied */
          fi;
          ok = 0
       fi
     }
  :: atomic {
       /* the apiserver's compare-and-swap in etcd */
       stage == S_ALLOWED ->
       if
       :: rv[c] == prv -> alloc[c] = d + 1; rv[c]++
       :: else                                                  /* 409 after the webhook */
       fi;
       infl[c] = 0;
       stage = S_IDLE; d = 0; prv = 0
     }
  :: atomic {
       /* the informer catches up */
       calloc[c] != alloc[c] || crv[c] != rv[c] || ctaint[0] != taint[0] || ctaint[1] != taint[1] ->
       calloc[c] = alloc[c]; crv[c] = rv[c];
       ctaint[0] = taint[0]; ctaint[1] = taint[1]
     }
  od
}

/* ===========================================================================
 * The pods of claim c, one after another: kubelet starts the container on
 * the allocated device (the vendor's driver prepares it; it asks no one);
 * the container ends; the resourceclaim controller removes the allocation
 * (a claim watch event for duet-bridge). Another pod may then use claim 0
 * (RUNS pods in all). Some other client may update claim 0 (its
 * resourceVersion, MAXBUMP times).
 * ======================================================================== */

proctype Pods(byte c) {
  byte runs = 1, bumps;
end_idle:
  do
  :: atomic { pod[c] == PD_PENDING && alloc[c] != 0 -> prun[c] = alloc[c]; pod[c] = PD_RUNNING }
  :: atomic { pod[c] == PD_RUNNING -> prun[c] = 0; pod[c] = PD_ENDED }
  :: atomic {
       pod[c] == PD_ENDED ->
       /* the resourceclaim controller deallocates the unreserved claim */
       alloc[c] = 0; rv[c]++; cw!c;
       if
       :: c == 0 && runs < RUNS -> runs++; pod[c] = PD_PENDING
       :: else -> pod[c] = PD_DONE
       fi
     }
  :: atomic { c == 0 && bumps < MAXBUMP -> bumps++; rv[c]++ }    /* another writer */
  od
}

/* ===========================================================================
 * duet-bridge's claim watch: a deallocated claim's holdings go back to its
 * lend owner (lent, free).
 *
 * Releasing claim c's holding of d is fenced as a reclaim is
 * (Lender::ReleaseClaimIfDeallocated): (1) flag the holding releasing under
 * the ledger's lock, so the webhook no longer admits c on d as already
 * held; (2) wait out admissions of c in flight (the code: admission_grace
 * after the claim's last admission, which must cover the apiserver's
 * write); (3) a quorum GET of c: still allocating d, the holding stays
 * (un-flag), else it goes back to Lend. The deallocation event and a
 * periodic sweep of claim holdings both trigger it; the model lets it
 * start at any time for any claim holding.
 *
 * BUG_DEALLOC_UNFENCED, the deallocation docs/dra.md first had: on the
 * deallocation event, in etcd's order, any time later. With NC = 2 this
 * double-books a device (model/README.md, "What the model found"): the
 * claim may be allocated again, on the same device, before the bridge sees
 * the event, and the webhook admits that as a claim already holding the
 * device.
 * ======================================================================== */
#ifdef BUG_DEALLOC_UNFENCED
proctype ClaimWatch() {
  byte c;
end_idle:
  do
  :: atomic {
       cw?c ->
       if
       :: led[0] == L_CLAIM(c) -> led[0] = L_LEND
       :: else
       fi;
       if
       :: led[1] == L_CLAIM(c) -> led[1] = L_LEND
       :: else
       fi;
       c = 0
     }
  od
}
#else
/* claim c holds d, the release of that holding is not under way */
#define HOLDS(c, d) (led[d] == L_CLAIM(c) && !rel[d])

proctype ClaimWatch() {
  byte c, d;
end_idle:
  do
  :: atomic {
       /* the trigger: claim c's deallocation event (any time after it
        * happened), or the sweep of a LIST showing that claim c does not
        * allocate a device it holds */
       cw?[c] || HOLDS(0, 0) && alloc[0] != 1 || HOLDS(0, 1) && alloc[0] != 2 ||
                 HOLDS(NC - 1, 0) && alloc[NC - 1] != 1 || HOLDS(NC - 1, 1) && alloc[NC - 1] != 2 ->
       if
       :: cw?c ->
          if
          :: HOLDS(c, 0) -> d = 0
          :: HOLDS(c, 1) -> d = 1
          :: else -> c = 0; goto claim_idle         /* holds nothing */
          fi
       :: HOLDS(0, 0) && alloc[0] != 1 -> c = 0; d = 0
       :: HOLDS(0, 1) && alloc[0] != 2 -> c = 0; d = 1
       :: HOLDS(NC - 1, 0) && alloc[NC - 1] != 1 -> c = NC - 1; d = 0
       :: HOLDS(NC - 1, 1) && alloc[NC - 1] != 2 -> c = NC - 1; d = 1
       fi;
       rel[d] = 1                                   /* (1) */
     };
     infl[c] != d + 1;                              /* (2) */
     atomic {                                       /* (3) */
       if
       :: alloc[c] != d + 1 -> led[d] = L_LEND
       :: else
       fi;
       rel[d] = 0; c = 0; d = 0
     };
claim_idle:
     skip
  od
}
#endif

/* ===========================================================================
 * The invariants, checked in every reachable state.
 * ======================================================================== */

/* I1: no device is used by a Slurm job's step and a claim's pod at once,
 * nor by two claims' pods. */
#define RUN_CLASH(a, b) ((a) != 0 && (a) == (b))
#define I1 \
  (!RUN_CLASH(srun[0], prun[0]) && !RUN_CLASH(srun[0], prun[NC - 1]) && \
   (NC == 1 || !RUN_CLASH(prun[0], prun[NC - 1])))

#ifndef NO_I1
active proctype CheckI1() {
end_watch:
  atomic { !I1 -> assert(I1) }
}
#endif

/* I2 (-DI2, not the default; see model/README.md): once a claim is
 * deallocated, no write of it is in flight and duet-bridge has seen the
 * deallocation, the ledger no longer holds a device for it. */
#ifdef I2
#define I2_CLAIM(c) (alloc[c] != 0 || infl[c] != 0 || len(cw) > 0 || \
                     (led[0] != L_CLAIM(c) && led[1] != L_CLAIM(c)))
#define I2_HOLDS (I2_CLAIM(0) && I2_CLAIM(NC - 1))
active proctype CheckI2() {
end_watch:
  atomic { !I2_HOLDS -> assert(I2_HOLDS) }
}
#endif

init {
  byte i;
  atomic {
    taint[0] = 1; taint[1] = 1;
    ctaint[0] = 1; ctaint[1] = 1;
    run Job(0);
    run Lender();
    run ClaimWatch();
    i = 0;
    do
    :: i < NC -> run Pods(i); run Scheduler(i); i++
    :: else -> break
    od;
    i = 0
  }
}
