"""The messages between the core, its instances and ``Serve``: every kind, who sends it, and its fields.

Each message is a msgpack map (``messages.pack_header``), followed on the worker socket by the frames its inline
buffers need. This package is the one place that knows their keys: everything else builds a message with its kind's
``build`` (or ``build_...``) and reads one through its kind's class, whose properties name the fields, importing both
from here. One module per group of the table below: ``instances`` (joining and leaving), ``batches``, ``bls``,
``control`` (Serve's requests), on ``message`` (what every kind shares).

=================  ===================  ==================  ============================================================
from -> to         kind                 class               fields (wire key)
=================  ===================  ==================  ============================================================
instance -> core   ``hello``            ``Hello``           model, version, instance_index (instance), instance_kind
                                                            (kind), pid, shm_prefix, host, node, device
core -> instance   ``welcome``          ``Welcome``         cancel_address (cancel)
core -> instance   ``refused``          ``Refused``         message
core -> instance   ``infer``            ``InferBatch``      batch_id (b), requests (r), blocks (x), trace (tc),
                                                            sequences (sq), released_sequences (sr)
instance -> core   ``res``              ``BatchResult``     batch_id (b), final, outputs (o), slots (s), timings (tm),
                                                            response_timings (rt), error (err), stage_times (st)
core -> instance   ``free``             ``FreeSlots``       slots
core -> instance   ``stop``             ``Stop``
instance -> core   ``bye``              ``Bye``
instance -> core   ``bls``              ``BlsRequest``      call_id (c), model, version, inputs (x), parameters (p),
                                                            outputs (o), request_id (id), stream, timeout_us (tu)
core -> instance   ``bls_res``          ``BlsResponse``     call_id (c), outputs (o), final, lease (l), error (err)
instance -> core   ``bls_cancel``       ``BlsCancel``       call_id (c)
instance -> core   ``bls_free``         ``BlsFree``         lease (l)
Serve -> core      ``load``             ``Load``            request_id (rid), spec, payload
Serve -> core      ``load_ensemble``    ``LoadEnsemble``    request_id (rid), ensemble (spec)
Serve -> core      ``unload``           ``Unload``          request_id (rid), name, version
Serve -> core      ``serving``          ``Serving``         request_id (rid)
Serve -> core      ``shutdown``         ``Shutdown``        request_id (rid)
core -> Serve      ``ok``, ``error``    ``ControlReply``    request_id (rid), error (message)
core -> instances  (cancel socket)      ``CancelNotice``    batch_id (b), request_indexes (i)
=================  ===================  ==================  ============================================================

Every message but the cancel notice carries its kind under ``t`` (``kind_of``). The keys stay short because ``infer``
and ``res`` go once per batch. For the same reason builders are plain functions that return the map, and a reader
takes the fields it has into slots when it is made (reading a property costs a call each on Python 3.11, more than
the lookup it wraps); only a model spec is decoded when read. Tensors
are lists ``[name, datatype, shape, loc]`` (``TensorDescriptor``), placed by ``messages.FrameWriter``.
"""

from __future__ import annotations

from pyserve.transport.protocol.batches import (
    MERGED,
    SEQUENCE_END,
    SEQUENCE_START,
    BatchResult,
    CancelNotice,
    FreeSlots,
    InferBatch,
    InputBlock,
    RequestEntry,
    SequenceEntry,
    TraceContext,
)
from pyserve.transport.protocol.bls import BlsCancel, BlsFree, BlsRequest, BlsResponse
from pyserve.transport.protocol.control import (
    ControlReply,
    ControlRequest,
    Load,
    LoadEnsemble,
    OpenRemote,
    Ping,
    Serving,
    Shutdown,
    Unload,
)
from pyserve.transport.protocol.instances import Bye, Hello, Refused, Stop, Welcome
from pyserve.transport.protocol.message import Header, Message, MessageKind, TensorDescriptor, kind_of

__all__ = [
    "MERGED",
    "SEQUENCE_END",
    "SEQUENCE_START",
    "BatchResult",
    "BlsCancel",
    "BlsFree",
    "BlsRequest",
    "BlsResponse",
    "Bye",
    "CancelNotice",
    "ControlReply",
    "ControlRequest",
    "FreeSlots",
    "Header",
    "Hello",
    "InferBatch",
    "InputBlock",
    "Load",
    "LoadEnsemble",
    "Message",
    "MessageKind",
    "OpenRemote",
    "Ping",
    "Refused",
    "RequestEntry",
    "SequenceEntry",
    "Serving",
    "Shutdown",
    "Stop",
    "TensorDescriptor",
    "TraceContext",
    "Unload",
    "Welcome",
    "kind_of",
]
