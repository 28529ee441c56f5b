#!/usr/bin/python3
"""A KV connector shaped like vLLM's (KVConnectorBase_V1), over Baton.

Two processes, as in disaggregated serving: a prefill worker computes the
paged KV cache of a prompt, and a decode worker pulls it layer by layer with
a deadline per layer, checks every byte, then saves the KV of the tokens it
generated back into the prefill side's cache (for a later turn), which checks
them too. Paged KV lives in torch CPU tensors, one per layer:
[num_blocks, block_size, num_heads, head_dim], float16.

    python3 python/examples/kv_connector.py        # runs both roles, prints "verified"

The connector's methods carry vLLM's names:
  scheduler side  get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta
  worker side     start_load_kv, wait_for_layer_load, save_kv_layer, wait_for_save
"""
import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

import baton

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 4, 64, 16, 8, 64
PROMPT_TOKENS = 200
LAYER_DEADLINE_MS = 200.0  # a layer late by more than this stalls decode


def kv_value(layer, block, salt):
    """What a block holds: deterministic, different per layer, block and producer."""
    g = torch.Generator().manual_seed(layer * 100_003 + block * 7 + salt)
    return torch.randn(BLOCK_SIZE, HEADS, HEAD_DIM, generator=g).to(torch.float16)


def blocks_for(tokens):
    return (tokens + BLOCK_SIZE - 1) // BLOCK_SIZE


@dataclass
class ConnectorMeta:
    """What the scheduler sends the workers for one request (vLLM's KVConnectorMetadata)."""
    request_id: str
    peer: str                 # the prefill worker's engine address
    remote_layers: list       # its region handle per layer
    remote_blocks: list       # its block ids holding the prompt
    local_blocks: list        # ours, allocated by our scheduler
    num_tokens: int


@dataclass
class KVConnector:
    engine: baton.Engine
    kv: list                                  # one torch tensor per layer
    regions: list = field(default_factory=list)
    loads: dict = field(default_factory=dict)   # layer -> Batch
    saves: list = field(default_factory=list)
    peer: baton.Peer = None

    def __post_init__(self):
        self.regions = [self.engine.register(t) for t in self.kv]
        self.block_bytes = self.kv[0][0].numel() * self.kv[0].element_size()

    # --- scheduler side -----------------------------------------------------
    def get_num_new_matched_tokens(self, remote_info):
        """Tokens of the prompt the remote side already holds: all of them here."""
        return remote_info["num_tokens"]

    def update_state_after_alloc(self, free_blocks, num_tokens):
        return [free_blocks.pop(0) for _ in range(blocks_for(num_tokens))]

    def build_connector_meta(self, request_id, remote_info, local_blocks):
        return ConnectorMeta(request_id, remote_info["address"], remote_info["layers"], remote_info["blocks"],
                             local_blocks, remote_info["num_tokens"])

    # --- worker side ------------------------------------------------------------
    def _requests(self, meta, layer, op, local_blocks, remote_blocks, deadline_ms, qos):
        return [baton.Request(op=op, local=self.regions[layer], local_offset=lb * self.block_bytes, peer=self.peer,
                              remote=meta.remote_layers[layer], remote_offset=rb * self.block_bytes,
                              length=self.block_bytes, qos=qos, deadline_ms=deadline_ms)
                for lb, rb in zip(local_blocks, remote_blocks)]

    def start_load_kv(self, meta):
        """Pull every layer's blocks at once; layer i is due i+1 deadlines from now."""
        self.peer = self.engine.connect(meta.peer)
        for layer in range(LAYERS):
            reqs = self._requests(meta, layer, "read", meta.local_blocks, meta.remote_blocks,
                                  LAYER_DEADLINE_MS * (layer + 1), "hot_kv" if layer == 0 else "prefill_bulk")
            self.loads[layer] = self.engine.submit(reqs)

    def wait_for_layer_load(self, layer):
        batch = self.loads.pop(layer)
        batch.wait(timeout=30)
        batch.release()

    def save_kv_layer(self, meta, layer, local_blocks, remote_blocks):
        reqs = self._requests(meta, layer, "write", local_blocks, remote_blocks, None, "background")
        note = f"saved {meta.request_id} layer {layer}".encode() if layer == LAYERS - 1 else b""
        self.saves.append(self.engine.submit(reqs, notification=note))

    def wait_for_save(self):
        for batch in self.saves:
            batch.wait(timeout=30)
            batch.release()
        self.saves.clear()


def new_kv():
    return [torch.zeros(BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, dtype=torch.float16) for _ in range(LAYERS)]


def prefill(args):
    """Computes the prompt's KV, serves it, and checks what decode saves back."""
    with baton.Engine() as engine:
        kv = new_kv()
        connector = KVConnector(engine, kv)
        for r in connector.regions:
            engine.export(r)
        prompt_blocks = list(range(3, 3 + blocks_for(PROMPT_TOKENS)))  # not 0..n: block tables are sparse
        for layer in range(LAYERS):
            for b in prompt_blocks:
                kv[layer][b] = kv_value(layer, b, salt=1)
        save_blocks = [50, 51]
        print(json.dumps({"address": engine.address, "layers": [r.handle for r in connector.regions],
                          "blocks": prompt_blocks, "num_tokens": PROMPT_TOKENS, "save_blocks": save_blocks}),
              flush=True)
        notes = []
        deadline = time.monotonic() + 60
        while not notes and time.monotonic() < deadline:  # decode says when its saves landed
            notes = engine.take_notifications()
            time.sleep(0.01)
        if not notes:
            print("prefill: no word from decode within 60 s", flush=True)
            return 1
        for layer in range(LAYERS):
            for i, b in enumerate(save_blocks):
                if not torch.equal(kv[layer][b], kv_value(layer, 1000 + i, salt=2)):
                    print(f"prefill: saved block {b} of layer {layer} differs", flush=True)
                    return 1
        print(f"prefill: {notes[0][1].decode()} verified", flush=True)
        return 0


def decode(args):
    child = subprocess.Popen([sys.executable, __file__, "--role", "prefill"], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(child.stdout.readline())
        with baton.Engine() as engine:
            kv = new_kv()
            connector = KVConnector(engine, kv)
            free = list(range(BLOCKS))[::-1]
            matched = connector.get_num_new_matched_tokens(info)
            local_blocks = connector.update_state_after_alloc(free, matched)
            meta = connector.build_connector_meta("req-0", info, local_blocks)
            connector.start_load_kv(meta)
            for layer in range(LAYERS):  # the model's forward pass, layer by layer
                connector.wait_for_layer_load(layer)
                for lb, rb in zip(meta.local_blocks, meta.remote_blocks):
                    if not torch.equal(kv[layer][lb], kv_value(layer, rb, salt=1)):
                        print(f"decode: layer {layer} block {lb} (remote {rb}) differs")
                        return 1
            # Decode generated tokens: their KV goes back to the prefill side's cache.
            gen_blocks = connector.update_state_after_alloc(free, 2 * BLOCK_SIZE)
            for layer in range(LAYERS):
                for i, b in enumerate(gen_blocks):
                    kv[layer][b] = kv_value(layer, 1000 + i, salt=2)
                connector.save_kv_layer(meta, layer, gen_blocks, info["save_blocks"])
            connector.wait_for_save()
            print(f"decode: {matched} prompt tokens in {len(local_blocks)} blocks x {LAYERS} layers loaded and "
                  f"verified; {len(gen_blocks)} blocks x {LAYERS} layers saved back")
        child_out = child.communicate(timeout=60)[0]
        print(child_out.strip())
        return 0 if child.returncode == 0 and "verified" in child_out else 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["decode", "prefill"], default="decode")
    args = parser.parse_args()
    rc = prefill(args) if args.role == "prefill" else decode(args)
    if args.role == "decode" and rc == 0:
        print("verified")
    return rc


if __name__ == "__main__":
    sys.exit(main())
