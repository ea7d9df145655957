"""One place for what reproarchive takes from torch's private surface.

Everything reproarchive reaches in torch that torch does not promise to keep, a dotted name with
a component that starts with one underscore (``torch._dynamo.config``, ``torch._C._dispatch_dump``,
``torch.utils._pytree``) or anything under ``torch.fx.experimental``, and the keys Dynamo,
AOTAutograd and Inductor write into an FX node's ``meta``, is reached through one module here per
concern; the rest of the library and the CLI import from these modules and never name such a thing
themselves (``tests/test_private_torch.py`` reads every module and fails when one does):

* ``dynamo``: the backend registry, Dynamo's config, exceptions and repro hooks (after_dynamo),
  guards (``TracingContext``, ``CompileContext``), sources, ``debug_utils``, ``clone_input`` and
  ``torch.compile``'s inductor wrapper;
* ``inductor``: Inductor's config, ``compile_fx`` (its inner compiler and its debug wrapper),
  the compiler bisector and the cache folders;
* ``fake``: fake tensors, ``ShapeEnv`` and the rest of ``torch.fx.experimental.symbolic_shapes``,
  ``make_fx`` and ``torch.utils._sympy``;
* ``fx_meta``: the keys of an FX node's ``meta`` (``val``, ``example_value``, ``tensor_meta``,
  ``nn_module_stack`` ...) and ``torch.fx.node._get_qualified_name``;
* ``distributed``: ``torch.distributed``'s private names (LocalTensor, the default group and
  store, the group registry, the fake process group's store);
* ``dispatch``: operator types (``torch._ops``), the dispatcher (``torch._C._dispatch_*``,
  ``parse_schema``), ``torch._library``'s registries, Python dispatch modes, higher-order-op
  internals (the Triton kernel side table) and ``torch.overrides``' private table;
* ``thread_state``: forward-mode AD and functorch's transform levels (``torch._C``);
* ``tensors``: tensor internals (``torch._utils``), traceable wrapper subclasses and the tensor
  subclasses torch defines in private modules;
* ``pytree``: ``torch.utils._pytree`` and ``torch.fx._pytree``;
* ``config_modules``: ``torch.utils._config_module`` (what a torch config module is);
* ``nn``: ``torch.nn``'s private base classes;
* ``absent_gpu``: ``torch.cuda``, Dynamo's CUDA device interface, Inductor's device-facing steps
  and Triton's driver answering from a recorded GPU description while a compile for a GPU this
  machine lacks runs (the one compat module that also reaches Triton).

Each module says why it exists and what changed between the torch versions it was checked with
(``CHECKED_WITH``), and lists the private names it touches (``PRIVATE_NAMES``, kept equal to what
the test's scan finds there). Nothing here imports torch when the module is imported: torch's
private modules are expensive (Dynamo, Inductor), and ``reproarchive --help`` and the format layer
must not pay for them, so every name is imported inside the function that needs it, and the
re-exported classes come from a module-level ``__getattr__``. The package sits just above
``reproarchive.format`` in the layers (``tests/test_layers.py``) and imports only torch, the
standard library and ``reproarchive.errors``.
"""
