"""The farm: many jobs across a Ray cluster. The only folder that imports ray.

* :mod:`.driver`: ``run_farm`` / ``FarmOptions``: read the manifest, plan, fan jobs out, record each result;
* :mod:`.plan`: the jobs of a manifest, keyed, and which of them a results DB already holds;
* :mod:`.isolation`: each job in a forked child of a warm fork server (timeouts, memory limits, crashes as results);
  :mod:`.warm` / :mod:`.warm_torch` are what that server preloads;
* :mod:`.hub_budget`: one request budget for the Hub shared by every worker.

Nothing here is imported at package level: ``zoo_convert.farm.isolation`` runs in the fork server without ray.
"""
