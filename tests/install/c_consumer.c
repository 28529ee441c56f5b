/* A C99 program built against an installed libbaton with
 * `cc $(pkg-config --cflags --libs baton)`: reads 1 MiB of `baton serve`'s
 * pattern-filled buffer and checks it, then writes 1 MiB of its own near the
 * buffer's end and reads it back.
 * Usage: c_consumer ADDRESS REGION BYTES (serve's "address" and "region" lines) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <baton/c/baton.h>

#define MIB ((uint64_t)1 << 20)
#define SECOND ((int64_t)1000000000)

#define CHECK(call)                                                                           \
  do {                                                                                        \
    int rc_ = (call);                                                                         \
    if (rc_ != BATON_OK) {                                                                    \
      fprintf(stderr, "c_consumer: %s: %s: %s\n", #call, baton_status_name(rc_), baton_last_error()); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

/* pattern_byte() of include/baton/engine/pattern.h with salt 0, which serve uses. */
static unsigned char pattern_byte(uint64_t index) {
  uint64_t x = index * 0xbf58476d1ce4e5b9ULL;
  return (unsigned char)((x >> 29) ^ (x >> 47));
}

/* One request, submitted, waited for, checked and released. */
static void transfer(baton_engine* engine, int op, uint32_t local, uint64_t local_offset, const char* peer,
                     uint32_t remote, uint64_t remote_offset) {
  baton_request r;
  baton_batch_status status;
  uint64_t batch = 0;
  memset(&r, 0, sizeof r);
  r.op = op;
  r.qos = BATON_QOS_HOT_KV;
  r.local_region = local;
  r.local_offset = local_offset;
  r.peer = peer;
  r.remote_region = remote;
  r.remote_offset = remote_offset;
  r.length = MIB;
  CHECK(baton_submit(engine, &r, 1, NULL, 0, &batch));
  CHECK(baton_wait(engine, batch, 30 * SECOND));
  CHECK(baton_poll(engine, batch, &status));
  if (!status.done || status.status != BATON_OK || status.bytes_done != MIB) {
    fprintf(stderr, "c_consumer: batch ended %s, %llu of %llu bytes: %s\n", baton_status_name(status.status),
            (unsigned long long)status.bytes_done, (unsigned long long)MIB, baton_last_error());
    exit(1);
  }
  CHECK(baton_release(engine, batch));
}

int main(int argc, char** argv) {
  baton_engine_config config;
  baton_engine* engine = NULL;
  baton_region local;
  baton_remote_region remote[16];
  char peer[256];
  size_t count = 0, i = 0;
  uint32_t key = 0;
  uint64_t served = 0, write_offset = 0;
  unsigned char* buffer = NULL;
  int found = 0;

  if (argc != 4) {
    fprintf(stderr, "usage: c_consumer ADDRESS REGION BYTES\n");
    return 2;
  }
  key = (uint32_t)strtoul(argv[2], NULL, 10);
  served = strtoull(argv[3], NULL, 10);
  if (served < 2 * MIB) {
    fprintf(stderr, "c_consumer: the served buffer has %llu bytes (at least 2 MiB needed)\n",
            (unsigned long long)served);
    return 2;
  }
  if (baton_abi_version() != BATON_ABI_VERSION) {
    fprintf(stderr, "c_consumer: libbaton has ABI %d, baton.h %d\n", baton_abi_version(), BATON_ABI_VERSION);
    return 1;
  }

  baton_engine_config_init(&config);
  config.listen_address = "127.0.0.1:0";
  CHECK(baton_engine_create(&config, &engine));
  /* [0, 1 MiB): the read; [1, 2 MiB): what is written; [2, 3 MiB): read back. */
  buffer = malloc(3 * MIB);
  if (buffer == NULL) return 1;
  CHECK(baton_register_memory(engine, buffer, 3 * MIB, BATON_MEMORY_DRAM, -1, &local));
  CHECK(baton_connect(engine, argv[1], peer, sizeof peer, NULL));
  CHECK(baton_remote_regions(engine, peer, remote, 16, &count));
  for (i = 0; i < count; ++i) found |= remote[i].key == key && remote[i].length == served;
  if (!found) {
    fprintf(stderr, "c_consumer: peer %s does not export region %u of %llu bytes\n", peer, key,
            (unsigned long long)served);
    return 1;
  }

  transfer(engine, BATON_OP_READ, local.handle, 0, peer, key, 0);
  for (i = 0; i < MIB; ++i) {
    if (buffer[i] != pattern_byte(i)) {
      fprintf(stderr, "c_consumer: read byte %zu is %u, the pattern says %u\n", i, buffer[i], pattern_byte(i));
      return 1;
    }
  }

  write_offset = served - MIB;
  for (i = 0; i < MIB; ++i) buffer[MIB + i] = (unsigned char)(i * 7 + 13);
  transfer(engine, BATON_OP_WRITE, local.handle, MIB, peer, key, write_offset);
  transfer(engine, BATON_OP_READ, local.handle, 2 * MIB, peer, key, write_offset);
  if (memcmp(buffer + MIB, buffer + 2 * MIB, MIB) != 0) {
    fprintf(stderr, "c_consumer: the bytes read back differ from those written\n");
    return 1;
  }

  CHECK(baton_unregister(engine, local.handle));
  baton_engine_destroy(engine);
  free(buffer);
  printf("c_consumer: read 1 MiB of the pattern, wrote and read back 1 MiB at offset %llu of %s\n",
         (unsigned long long)write_offset, peer);
  return 0;
}
