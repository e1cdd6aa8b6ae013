"""Framework integrations: Pydantic AI, the OpenAI Agents SDK and LangGraph on stepledger.

Each module imports its framework when it is imported (``pip install
'stepledger[openai-agents]'`` and so on); this package imports none.  The pieces they share
(step ids a model cannot change, model turns as steps, a deterministic order for parallel
tool calls) are in :mod:`stepledger.integrations._core`.
"""
