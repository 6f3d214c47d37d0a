"""Outside agents: any code that speaks the OpenAI API runs an episode against the policy, and the
tokens trained are exactly the tokens it was sampled.

calls.py     EpisodeLog: an episode's calls (prompt ids, sampled ids, log-probs) and the training sequences they make
render.py    ChatRenderer: messages -> prompt ids with the episode's own replies as their sampled tokens; replies -> tool_calls
tags.py      the tag protocol (tools.format=tags): `<calc>..</calc>` replies as tool_calls, a call and its results one turn
batcher.py   Batcher: concurrent requests of many episodes sampled in one decode; engine_sampler adapts a GenerationEngine
api.py       OpenAI's request fields and response shapes
stream.py    `stream: true`: a finished reply as OpenAI's server-sent events
endpoint.py  AgentEndpoint: the HTTP server on 127.0.0.1 with a key and one base URL per episode
source.py    AgentSource: `rollout.agent`, the user's agent run G times per row against the endpoint
"""

from rlvr.rollout.sources.agent.batcher import Batcher, Sampler, engine_sampler
from rlvr.rollout.sources.agent.calls import Call, EpisodeLog, TrainingSequence
from rlvr.rollout.sources.agent.endpoint import AgentEndpoint, call_seed
from rlvr.rollout.sources.agent.render import ChatRenderer

__all__ = ["AgentEndpoint", "Batcher", "Call", "ChatRenderer", "EpisodeLog", "Sampler", "TrainingSequence", "call_seed", "engine_sampler"]
