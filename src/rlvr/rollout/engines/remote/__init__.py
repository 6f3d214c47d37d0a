"""Generation on servers: the trainer's side of `rollout.servers` (the servers themselves: rlvr.serve).

protocol.py     what trainer and server say: token ids in, sampled ids, log-probs and a weight version out
client.py       the client of rlvr's own server (`rlvr serve --engine hf`); make_client picks the client a URL needs
vllm_client.py  the client of vLLM's own server (`rlvr serve --engine vllm`)
pool.py         ServerPool: a request's prompts spread over the live servers, a failed server dropped, its rows redone
engine.py       RemoteEngine: the GenerationEngine / MultiTurnEngine on a pool, and the weight sync after each update
"""
