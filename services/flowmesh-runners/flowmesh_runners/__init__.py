"""FlowMesh's ML runners: each task runs in its own process under the worker's plugin contract.

Protocol (see ``protocol`` and ARCHITECTURE.md): the task JSON is at ``$FLOWMESH_TASK_FILE``; the
runner writes artifacts under ``$FLOWMESH_OUTPUT_DIR``, progress as JSON lines to
``$FLOWMESH_PROGRESS_FILE`` and its result JSON to ``$FLOWMESH_RESULT_FILE``; exit 0 is success,
75 a retryable failure, anything else a permanent one.
"""
