/* Baton's C ABI: the Engine (include/baton/engine/engine.h) for C and for
 * languages that bind C. Plain C99: no C++ type and no exception crosses it.
 *
 * Every function returns a status code (BATON_OK, or the failure); on a
 * failure baton_last_error() holds its text. Output arguments are written
 * only on BATON_OK, unless a function says otherwise. Engine handles are
 * looked up, never dereferenced: a NULL, destroyed or made-up one answers
 * BATON_MISUSE instead of crashing (handles are random 64-bit values, so a
 * made-up one names a live engine only by a one-in-2^63 chance).
 *
 * Caller buffers: a function that writes text or an array into the caller's
 * memory takes its capacity and reports the size it needs (text: bytes
 * including the terminating NUL). A NULL buffer with capacity 0 asks for the
 * size only (BATON_OK); a buffer too small answers BATON_OUT_OF_RANGE with the
 * size reported and nothing written. The size pointer (`needed`) may be NULL.
 *
 * Threads: any thread may call any function, as with the C++ Engine. */
#ifndef BATON_C_BATON_H
#define BATON_C_BATON_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define BATON_C_API __attribute__((visibility("default")))
#else
#define BATON_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this ABI: the layout of its structs and the meaning of its
 * functions. A change that breaks a caller compiled against an older
 * baton.h raises it. */
#define BATON_ABI_VERSION 1

/* Status codes: baton::StatusCode in the same order, then BATON_MISUSE. */
enum {
  BATON_OK = 0,
  BATON_INVALID_ARGUMENT,
  BATON_NOT_FOUND,
  BATON_ALREADY_EXISTS,
  BATON_OUT_OF_RANGE,
  BATON_TIMEOUT,
  BATON_CANCELLED,
  BATON_UNAVAILABLE,
  BATON_DEADLINE_INFEASIBLE,
  BATON_RESOURCE_EXHAUSTED,
  BATON_FAILED_PRECONDITION,
  BATON_PERMISSION_DENIED,
  BATON_INTERNAL,
  /* The C call itself was misused: a NULL pointer where one is required, an
   * unknown engine handle, a capacity without a buffer, a bad struct size. */
  BATON_MISUSE
};

/* Request::op: the order of baton::transport::Op. */
enum { BATON_OP_WRITE = 0, BATON_OP_READ = 1 };

/* Request::qos: the order of baton::sched::QosClass. */
enum { BATON_QOS_DECODE_CRITICAL = 0, BATON_QOS_HOT_KV = 1, BATON_QOS_PREFILL_BULK = 2, BATON_QOS_BACKGROUND = 3 };

/* Where a region's bytes live (baton::transport::MemoryKind). */
enum { BATON_MEMORY_DRAM = 0, BATON_MEMORY_VRAM = 1 };

/* --- Errors ---------------------------------------------------------------- */

/* BATON_ABI_VERSION of the library loaded at run time. */
BATON_C_API int baton_abi_version(void);
/* "ok", "invalid_argument", ... "misuse"; "unknown" for another number. */
BATON_C_API const char* baton_status_name(int status);
/* The text of the last failure on this thread ("" before any); valid until
 * the next failing call on this thread. */
BATON_C_API const char* baton_last_error(void);

/* --- The engine ------------------------------------------------------------ */

typedef struct baton_engine baton_engine;

/* Every string is optional: NULL (or "") keeps the default. */
typedef struct baton_engine_config {
  /* sizeof(baton_engine_config): set by baton_engine_config_init(). Below
   * the first layout's (offsetof nics) or above 4096: BATON_MISUSE. */
  size_t size;
  const char* listen_address;  /* "host:port" peers connect to; default "127.0.0.1:0" (a free port) */
  const char* ucx_tls;         /* UCX_TLS for this engine ("tcp"); default: UCX's own */
  const char* secret_file;     /* the deployment secret (chmod 600); NULL: $BATON_TOKEN_FILE, else loopback only; "" is refused */
  const char* policy_file;     /* a YAML scheduling policy (configs/sched_policy.yaml); default: built in */
  const char* metrics_address; /* "host:port" to serve GET /metrics on (port 0: a free one); default: none */
  /* The NICs that carry slices, comma-separated, one UCP context each
   * ("eth1,eth2", "mlx5_0:1,mlx5_1:1"), or "auto" (the topology's); default:
   * UCX's own choice. Added after the first layout: `size` tells it apart. */
  const char* nics;
  /* 1: this host's GPU paths, for requests between the engine's own regions
   * (baton_request.peer ""); EngineConfig::gpu_paths. Default 0. Added
   * after `nics`. */
  int32_t gpu_paths;
  /* 1: listen beyond loopback without a secret, any process that reaches
   * the port a peer (UcxConfig::allow_unauthenticated; it logs a warning).
   * Default 0: such a listen address is refused without secret_file. Added
   * after `gpu_paths`. */
  int32_t allow_unauthenticated;
} baton_engine_config;

/* Sets every field this library knows to its default within the caller's
 * `size` bytes (sizeof *config), zeroes the rest of them (a newer
 * baton.h's fields), and sets config->size to `size`; below the first
 * layout's size nothing is written. Called through the macro below. */
BATON_C_API void baton_engine_config_init_sized(baton_engine_config* config, size_t size);
/* baton_engine_config_init(&config): the caller's own struct size goes with
 * it, so a library newer than the program's baton.h writes nothing past the
 * program's struct (the function of that name, kept for programs built
 * before, writes this library's whole struct). */
BATON_C_API void(baton_engine_config_init)(baton_engine_config* config);
#define baton_engine_config_init(config) baton_engine_config_init_sized((config), sizeof *(config))
/* Starts an engine (its loop thread and listener) into *engine. `config`
 * NULL: every default. Errors as Engine::create (the policy file's, UCX's). */
BATON_C_API int baton_engine_create(const baton_engine_config* config, baton_engine** engine);
/* Cancels what runs, closes every peer and the listener. Later calls that
 * would start work (register, allocate, export, unregister, connect,
 * refresh, remote_regions, submit, cancel) answer BATON_UNAVAILABLE; poll,
 * wait and release still answer for batches submitted before (they ended,
 * cancelled where they were still running), and the address, event fd and
 * notification calls still answer. The handle stays valid until destroyed. */
BATON_C_API int baton_engine_shutdown(baton_engine* engine);
/* Shuts the engine down (as baton_engine_shutdown: a thread waiting on one
 * of its batches returns, and nothing lands in registered memory once this
 * returns — a peer process of this host that writes it itself is waited for
 * up to the revoke timeout, 5 s; one stopped longer is logged as an error,
 * and may still write there when continued) and frees it (and the memory it
 * allocated); the handle turns unknown, so poll what you need first. NULL
 * is ignored. */
BATON_C_API void baton_engine_destroy(baton_engine* engine);
/* The address peers connect to, "127.0.0.1:41234" (a caller buffer). */
BATON_C_API int baton_engine_address(baton_engine* engine, char* address, size_t capacity, size_t* needed);
/* Where GET /metrics is served, or "" (a caller buffer). */
BATON_C_API int baton_engine_metrics_address(baton_engine* engine, char* address, size_t capacity, size_t* needed);

/* --- Memory ---------------------------------------------------------------- */

/* A registered local range; peers name `handle` as their remote_region. */
typedef struct baton_region {
  uint32_t handle;
  void* base;
  uint64_t length;
} baton_region;

/* Registers [ptr, ptr + length) for transfers (BATON_MEMORY_DRAM or _VRAM;
 * device: GPU index, or for DRAM the NUMA node it is on, -1 unsaid; any
 * other value, or a node this machine lacks, is BATON_INVALID_ARGUMENT).
 * Peers see it once exported. */
BATON_C_API int baton_register_memory(baton_engine* engine, void* ptr, size_t length, int kind, int device,
                                      baton_region* region);
/* Memory the engine allocates and registers, its pages preferably on NUMA
 * node numa_node (-1: the kernel's default; a node this machine lacks is
 * BATON_INVALID_ARGUMENT); freed by baton_unregister() or with the engine.
 * Same-host peers reach it directly. */
BATON_C_API int baton_allocate_memory(baton_engine* engine, size_t length, int numa_node, baton_region* region);
/* Makes a region visible to the peers named (their listen addresses), or to
 * every peer that proves the secret when peer_count is 0; at most 2^20
 * names. */
BATON_C_API int baton_export_region(baton_engine* engine, uint32_t region, const char* const* peers,
                                    size_t peer_count);
/* Revokes a region from every peer and unmaps it; once it returns BATON_OK
 * the caller may free the memory. BATON_TIMEOUT (after the revoke timeout
 * and 5 s) when a peer process of this host that copies into the memory
 * itself has not acknowledged (stopped?): it may still write there, so
 * keep the memory and call again; it answers BATON_OK once that process
 * acknowledged or exited. */
BATON_C_API int baton_unregister(baton_engine* engine, uint32_t region);

/* --- Peers ----------------------------------------------------------------- */

/* A peer's region as the handshake made it known: `key` goes in
 * baton_request.remote_region. */
typedef struct baton_remote_region {
  uint32_t key;
  /* 1: the peer's GPU memory, which its engine serves with a copy per
   * transfer; 0: host memory. (What was padding: the size is unchanged.) */
  uint32_t staged;
  uint64_t base;
  uint64_t length;
} baton_remote_region;

/* Handshakes with the engine listening at `address` ("host:port"), blocking
 * until ready or the handshake's 5 s ran out (BATON_UNAVAILABLE); its name
 * for requests goes into `peer` (a caller buffer; a size query or a buffer
 * too small still connects): the address resolved ("localhost:7000" is named
 * "127.0.0.1:7000"), which every later call names it by. Connecting again
 * to a live peer returns at once. */
BATON_C_API int baton_connect(baton_engine* engine, const char* address, char* peer, size_t capacity,
                              size_t* needed);
/* Waits up to timeout_ns (0: 5 s) for the peer's current list of regions. */
BATON_C_API int baton_refresh(baton_engine* engine, const char* peer, int64_t timeout_ns);
/* The peer's regions known here into `regions` (a caller array of
 * `capacity`); *count is how many there are. */
BATON_C_API int baton_remote_regions(baton_engine* engine, const char* peer, baton_remote_region* regions,
                                     size_t capacity, size_t* count);

/* --- Batches --------------------------------------------------------------- */

/* One transfer between a local region range and a peer's region range: a read
 * brings the peer's bytes here, a write sends ours there. */
typedef struct baton_request {
  int32_t op;              /* BATON_OP_READ or BATON_OP_WRITE */
  int32_t qos;             /* BATON_QOS_* */
  uint32_t local_region;   /* baton_region.handle */
  uint32_t remote_region;  /* baton_remote_region.key */
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t length;
  const char* peer;        /* the peer's name, as baton_connect() wrote it; "": remote_region is
                            * another of this engine's regions, moved over its GPUs' paths */
  int64_t deadline_ns;     /* relative to the submit; 0: none */
  int64_t timeout_ns;      /* relative to the submit; 0: the policy's (60 s by default) */
} baton_request;

/* A batch's state (Engine::poll). */
typedef struct baton_batch_status {
  int32_t done;        /* 1 once every request ended */
  int32_t status;      /* once done: BATON_OK or the first failure (its text in baton_last_error()) */
  uint64_t bytes;      /* of every request together */
  uint64_t bytes_done;
} baton_batch_status;

/* Validates every request, then queues them all (or none) into *batch
 * (count: at most 2^24). `notification` (at most 4 KiB, a longer
 * notification_length is BATON_INVALID_ARGUMENT before a byte is read; NULL
 * when notification_length is 0) goes to the peer once every request
 * completed; it needs a single peer. */
BATON_C_API int baton_submit(baton_engine* engine, const baton_request* requests, size_t count,
                             const void* notification, size_t notification_length, uint64_t* batch);
/* A batch to submit many times (Engine::PreparedBatch): the requests are
 * checked and copied once, as baton_submit checks them, into *prepared, an
 * id on this engine. baton_submit_prepared then submits them, with
 * baton_submit's answers; a same-host batch resolves its peer, regions and
 * ranges again only when a region or peer of the engine came or went since.
 * Deadlines stay relative to each submit. Concurrent submits of one
 * prepared batch take turns. At most 65536 held per engine
 * (BATON_RESOURCE_EXHAUSTED); baton_unprepare forgets one (BATON_NOT_FOUND
 * for an unknown id). Destroying the engine forgets them all. */
BATON_C_API int baton_prepare(baton_engine* engine, const baton_request* requests, size_t count,
                              const void* notification, size_t notification_length, uint64_t* prepared);
BATON_C_API int baton_submit_prepared(baton_engine* engine, uint64_t prepared, uint64_t* batch);
BATON_C_API int baton_unprepare(baton_engine* engine, uint64_t prepared);
/* Submit, wait and release in one call (Engine::run): BATON_OK once every
 * request completed, else the first failed request's code (its text in
 * baton_last_error()); baton_submit's refusals as they are. Each request's
 * timeout bounds the wait, except a slice already on the wire to a peer that
 * stopped answering: its request ends when the path fails, at the stall
 * timeout (10 s by default; docs/reliability.md). A prepared same-host batch on the loop-free path
 * leaves no batch behind at all (the fastest way to move one small block). */
BATON_C_API int baton_run(baton_engine* engine, const baton_request* requests, size_t count,
                          const void* notification, size_t notification_length);
BATON_C_API int baton_run_prepared(baton_engine* engine, uint64_t prepared);
/* A snapshot of the batch. BATON_NOT_FOUND for an unknown or released one. */
BATON_C_API int baton_poll(baton_engine* engine, uint64_t batch, baton_batch_status* status);
/* Until the batch ended (BATON_OK; then poll it) or timeout_ns passed
 * (BATON_TIMEOUT; 0 is a look that answers at once; a negative timeout_ns
 * is BATON_INVALID_ARGUMENT). A
 * same-host batch up to UcxConfig::direct_copy_max_bytes (16 MiB) is copied
 * inside baton_submit while the engine's loop holds no request of its own
 * and no deadline of it is closer than 1 ns a byte: it has ended when
 * submit returns, unless it has a notification (it ends once the loop sent
 * that, just after); a larger one is copied on the engine's copier thread
 * and ends there. Any other batch goes through the loop. */
BATON_C_API int baton_wait(baton_engine* engine, uint64_t batch, int64_t timeout_ns);
/* Cancels the batch's running requests and returns at once; wait() before
 * reusing their memory. A batch that already ended: BATON_INVALID_ARGUMENT. */
BATON_C_API int baton_cancel(baton_engine* engine, uint64_t batch);
/* Forgets an ended batch: its handle turns unknown. A batch still running:
 * BATON_INVALID_ARGUMENT. */
BATON_C_API int baton_release(baton_engine* engine, uint64_t batch);
/* An eventfd, owned by the engine, that turns readable whenever a batch ends
 * (read 8 bytes to reset it; then poll the batches waited for). */
BATON_C_API int baton_batch_event_fd(baton_engine* engine, int* fd);

/* Takes the oldest notification peers sent this engine: the sender's name
 * into `from` (a caller buffer, *from_needed) and its bytes into `message`
 * (*message_length). *taken is 0 when none waits. `from` NULL with
 * from_capacity 0 only reports the oldest one's sizes (nothing is taken:
 * *taken is 0 and a waiting one shows as *from_needed > 0);
 * buffers too small: BATON_OUT_OF_RANGE with the sizes, nothing taken.
 * Unlike the other size pointers, from_needed, message_length and taken may
 * not be NULL (BATON_MISUSE): they are how the caller learns what it took. */
BATON_C_API int baton_take_notification(baton_engine* engine, char* from, size_t from_capacity,
                                        size_t* from_needed, void* message, size_t message_capacity,
                                        size_t* message_length, int* taken);

#ifdef __cplusplus
}
#endif

#endif /* BATON_C_BATON_H */
