"""The rules of the index (spec §5 rules 6, 7 and 9, §6–§8): decode and encode, one checker per
spec section, every refusal tagged with its rule id (``errors.Rule``), one module per family:

* ``decode``: ``decode_index`` and ``encode_index``, which run every rule in the order the spec
  lists them, and the member list (§5 rule 7);
* ``names``: the shapes of names FX pastes into code (call targets, attribute paths, devices);
* ``values``: storages (§6.2), values and tensor views (§6.3);
* ``graph``: nodes, their arguments and module state (§7);
* ``records``: the §8 record sections that point into the rest of the index (shapes, RNG, failure);
* ``job``: the ranks of a multi-rank job (§8 ``job``);
* ``triton``: user Triton kernels (§8 ``triton_kernels``).

``decode_index`` turns the index member's bytes into a ``schema.Index`` and checks every rule;
code that holds an ``Index`` never re-checks a field or reads a raw map. ``encode_index`` is its
mirror and runs the same checks, so a writer cannot produce an index this reader refuses. The
converters check types (rule R6-1); the checkers check values, ranges and references, each
under the rule of its own section.

Only rules that are properties of the bytes live here (this layer knows nothing of torch).
What depends on the torch doing the reading (is this call target allowed by its effects, does
this torch know this device type) is checked by ``reproarchive.codec`` when records become
torch objects; the *shape* of a call-target or method name is written here once and used there.
"""

from reproarchive.format.schema.rules.decode import decode_index, encode_index

__all__ = ["decode_index", "encode_index"]
