"""Planning a run: each baseline group's model, task, pairs and servers (group_plan), the next
group's servers started ahead (groups_ahead), and on GPUs which groups run at once and where
(packing: the one scheduler) as child runs (packed)."""
