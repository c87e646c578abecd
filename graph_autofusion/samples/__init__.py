"""Sample inputs (F9): feeds generated from a model's input specs (:mod:`.inputs`), the values
of inputs that carry shapes, sizes or indices derived from the model (:mod:`.sample_inputs`,
:mod:`.input_roles`), a KV-cache decoder's inputs made to agree (:mod:`.kv_inputs`), and the
error naming the node the model fails at on them (:mod:`.run_failure`).

Below the planner (its analysis prices a model on generated feeds) and safe mode (which checks
fusions on them); it imports only the IR, the errors and, inside functions, the ONNX frontend.
"""
