"""TabbyAPI: its config models per branch, the check of an exported ``tabbyapi.yml``, and the
``tabbyapi`` engine that runs a user's TabbyAPI checkout (:mod:`.engine`).

Which branch goes with which backend: TabbyAPI ``main`` runs ExLlamaV3 (EXL3 models,
``backend: exllamav3``; :mod:`.schema_main`), TabbyAPI ``exl2-checkpoint`` runs ExLlamaV2
(EXL2 models, ``backend: exllamav2``; :mod:`.schema_exl2`). See docs/tabbyapi.md.
"""
