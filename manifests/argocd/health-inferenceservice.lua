-- Argo CD health check for kvloop.io/InferenceService.
-- Install: argocd-cm data key "resource.customizations.health.kvloop.io_InferenceService"
-- (see argocd-cm-patch.yaml beside this file).
local hs = {}
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local conds = {}
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    conds[c.type] = c
  end
end
if conds["Degraded"] ~= nil and conds["Degraded"].status == "True" then
  hs.status = "Degraded"
  hs.message = conds["Degraded"].message
  return hs
end
if conds["Ready"] ~= nil and conds["Ready"].status == "True" then
  if conds["FeedbackHealthy"] ~= nil and conds["FeedbackHealthy"].status == "False" then
    hs.status = "Healthy"
    hs.message = "Ready; feedback: " .. (conds["FeedbackHealthy"].message or "")
    return hs
  end
  hs.status = "Healthy"
  hs.message = conds["Ready"].message
  return hs
end
hs.status = "Progressing"
if conds["Progressing"] ~= nil and conds["Progressing"].message ~= nil then
  hs.message = conds["Progressing"].message
else
  hs.message = "Rolling out"
end
return hs
