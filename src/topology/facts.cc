#include "baton/topology/facts.h"

namespace baton::topology {

const Relation* TopologyFacts::find(DeviceRef a, DeviceRef b) const {
  for (const Relation& r : relations) {
    if ((r.a == a && r.b == b) || (r.a == b && r.b == a)) return &r;
  }
  return nullptr;
}

const char* to_string(PciLocality locality) {
  switch (locality) {
    case PciLocality::kPix: return "PIX";
    case PciLocality::kPxb: return "PXB";
    case PciLocality::kPhb: return "PHB";
    case PciLocality::kNode: return "NODE";
    case PciLocality::kSys: return "SYS";
    case PciLocality::kUnknown: return "?";
  }
  return "?";
}

}  // namespace baton::topology
