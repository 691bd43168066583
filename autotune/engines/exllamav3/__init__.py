"""ExLlamaV3 1.6.x: the in-process engine (:mod:`.engine`), its pure load plan and TabbyAPI main
export (:mod:`.plan`) and its pre-launch estimate (:mod:`.predict`)."""
