"""The APIs of the systems Conveyor succeeds, over Conveyor's own: code written for them runs with its import lines changed.

`conveyor.compat.daskqueue` (daskqueue) and `conveyor.compat.kale` (ndkale); Quokka's runtime API is
`conveyor.TaskGraph` itself. Each has a migration page in docs/.
"""
