"""`python -m engine.paro.plan ...`: the planner's table (engine.paro.planner)."""

from engine.paro.planner import main

if __name__ == "__main__":
    main()
