"""The snapshot store: how a run's states are written, kept small and read back.

`snapshots` writes each step's pre and post state as a reference, a delta (`delta`) or a
keyframe and reads any of them back; `codec` compresses the stored values (a delta against
its keyframe's text, a read result against its step's delta); `hashing` keeps a state's
Merkle hash and size up to date from its deltas; `prefixes` tells the delta encoder which
lists only grew; `rawsql` holds the step path's few guarded statements; `paths` indexes the
paths each delta touched, which `watch` uses to list every change of one value;
`compaction` regroups a finished run's deltas; `callsearch` and `search` find the steps of a
run by what they did. Nothing here sends work to a worker: the engine does that.
"""
