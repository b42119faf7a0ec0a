// The libfabric backend's decisions from what a provider says (provider.h), on fi_info answers
// built by hand as efa, verbs;ofi_rxm and broken providers would give them: which providers it
// refuses and why, how signals travel (remote CQ data or messages), whether GPU memory is
// registrable (FI_HMEM) or only staged, which registration modes it follows, and the remote CQ data's
// layout. No NIC and no libfabric library are needed: nothing here calls into libfabric.
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <string>

#include "../libfabric/provider.h"
#include "../libfabric/wire.h"
#include "test_util.h"

using namespace fusedcomm::rdma;
using namespace fusedcomm::rdma::libfabric;

namespace {

// An fi_info with its attribute structs, as a provider answers.
struct FakeInfo {
  fi_info info{};
  fi_fabric_attr fabric{};
  fi_domain_attr domain{};
  fi_ep_attr ep{};
  std::string prov, dom;

  FakeInfo(const char* provider, const char* domain_name) : prov(provider), dom(domain_name) {
    info.fabric_attr = &fabric;
    info.domain_attr = &domain;
    info.ep_attr = &ep;
    fabric.prov_name = prov.data();
    domain.name = dom.data();
    ep.type = FI_EP_RDM;
    ep.max_msg_size = uint64_t{1} << 32;
    info.caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
    domain.mr_key_size = 8;
  }
};

// EFA as libfabric 1.17+ answers on a p4d/p5: RDM, 4 bytes of CQ data, the provider's keys,
// virtual addresses, local registration, FI_HMEM where the query asked for it.
FakeInfo efa(bool hmem) {
  FakeInfo f("efa", "rdmap16s27-rdm");
  f.domain.mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | (hmem ? FI_MR_HMEM : 0);
  f.domain.cq_data_size = 4;
  f.domain.mr_key_size = 4;
  f.info.mode = FI_CONTEXT2;
  if (hmem) f.info.caps |= FI_HMEM;
  return f;
}

// verbs;ofi_rxm on a ConnectX: 4 bytes of CQ data, no FI_HMEM (no GPUDirect in this build of
// the provider), remote CQ data consumes a posted receive.
FakeInfo verbs() {
  FakeInfo f("verbs;ofi_rxm", "mlx5_0");
  f.domain.mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  f.domain.cq_data_size = 4;
  f.domain.mr_key_size = 4;
  f.info.mode = FI_RX_CQ_DATA;
  return f;
}

void test_efa_with_hmem() {
  FakeInfo f = efa(true);
  FC_CHECK(unusable(f.info).empty(), "efa usable: " + unusable(f.info));
  const Caps c = caps_of(f.info);
  FC_CHECK(c.provider == "efa" && c.domain == "rdmap16s27-rdm", "names");
  FC_CHECK(c.virt_addr && c.prov_key && c.mr_local && !c.mr_endpoint && !c.rx_cq_data, "registration modes");
  FC_CHECK(c.key_bytes == 4 && c.cq_data_bytes == 4 && c.hmem, "key, CQ data, FI_HMEM");
  const Plan p = plan_for(c, LibfabricSignal::kAuto);
  FC_CHECK(p.cq_data && p.hmem, "CQ-data signals, FI_HMEM offered");
  FC_CHECK(p.layout.stream_bits == 12 && p.layout.seq_bits == 19, "4-byte layout");
  const std::string d = describe_plan(c, p);
  FC_CHECK(d.find("remote CQ data (4 bytes)") != std::string::npos &&
               d.find("FI_HMEM offered") != std::string::npos,
           d);
}

void test_efa_without_hmem_stages() {
  FakeInfo f = efa(false);
  const Caps c = caps_of(f.info);
  const Plan p = plan_for(c, LibfabricSignal::kAuto);
  FC_CHECK(!p.hmem && p.cq_data, "no FI_HMEM: host staging, signals still on CQ data");
  FC_CHECK(describe_plan(c, p).find("host staging") != std::string::npos, describe_plan(c, p));
  // The FI_HMEM query answered, but without FI_HMEM in its caps: staging too.
  FakeInfo g = efa(true);
  g.info.caps &= ~FI_HMEM;
  FC_CHECK(!plan_for(caps_of(g.info), LibfabricSignal::kAuto).hmem, "FI_HMEM must be in the caps");
}

void test_verbs() {
  FakeInfo f = verbs();
  FC_CHECK(unusable(f.info).empty(), "verbs usable: " + unusable(f.info));
  const Caps c = caps_of(f.info);
  FC_CHECK(c.rx_cq_data && c.prov_key && c.virt_addr && c.mr_local, "FI_RX_CQ_DATA and registration modes");
  const Plan p = plan_for(c, LibfabricSignal::kAuto);
  FC_CHECK(p.cq_data && !p.hmem, "CQ-data signals, host staging");
  // Messages when asked for, whatever the provider has.
  FC_CHECK(!plan_for(c, LibfabricSignal::kMessage).cq_data, "kMessage");
}

void test_no_cq_data() {
  FakeInfo f = verbs();
  f.domain.cq_data_size = 0;
  const Caps c = caps_of(f.info);
  FC_CHECK(!plan_for(c, LibfabricSignal::kAuto).cq_data, "no remote CQ data: signals as messages");
  FC_CHECK(describe_plan(c, plan_for(c, LibfabricSignal::kAuto)).find("messages after delivery-complete") !=
               std::string::npos,
           "described");
  FC_EXPECT_THROW(TransportError, plan_for(c, LibfabricSignal::kCqData), e, {
    FC_CHECK(std::string(e.what()).find("too few for the signals") != std::string::npos, e.what());
  });
  f.domain.cq_data_size = 2;  // too small for a stream id and a sequence number
  FC_CHECK(!plan_for(caps_of(f.info), LibfabricSignal::kAuto).cq_data, "2 bytes: messages");
  f.domain.cq_data_size = 8;
  const Plan eight = plan_for(caps_of(f.info), LibfabricSignal::kAuto);
  FC_CHECK(eight.cq_data && eight.layout.stream_bits == 16 && eight.layout.seq_bits == 47, "8-byte layout");
}

void test_refusals() {
  {
    FakeInfo f = efa(false);
    f.info.caps &= ~FI_RMA;
    FC_CHECK(unusable(f.info).find("no RMA (FI_RMA)") != std::string::npos, unusable(f.info));
  }
  {
    FakeInfo f = efa(false);
    f.info.caps &= ~FI_MSG;
    FC_CHECK(unusable(f.info).find("FI_MSG") != std::string::npos, unusable(f.info));
  }
  {
    FakeInfo f = efa(false);
    f.info.caps &= ~(FI_REMOTE_WRITE);  // reads and local writes only: nothing lands here
    FC_CHECK(unusable(f.info).find("FI_REMOTE_WRITE") != std::string::npos, unusable(f.info));
  }
  {
    FakeInfo f = efa(false);
    f.info.caps &= ~(FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV);
    FC_CHECK(unusable(f.info).empty(), "no direction bits: both directions (fi_getinfo(3))");
  }
  {
    FakeInfo f = efa(false);
    f.ep.type = FI_EP_MSG;
    FC_CHECK(unusable(f.info).find("FI_EP_RDM") != std::string::npos, unusable(f.info));
  }
  {
    FakeInfo f = verbs();
    f.domain.mr_mode |= FI_MR_RMA_EVENT;
    FC_CHECK(unusable(f.info).find("registration modes") != std::string::npos, unusable(f.info));
  }
  {
    FakeInfo f = verbs();
    f.domain.mr_mode |= FI_MR_RAW;
    FC_CHECK(!unusable(f.info).empty(), "FI_MR_RAW refused");
  }
  {
    FakeInfo f = verbs();
    f.info.mode |= FI_MSG_PREFIX;
    FC_CHECK(unusable(f.info).find("operation modes") != std::string::npos, unusable(f.info));
  }
  {
    FakeInfo f = verbs();
    f.domain.mr_mode |= FI_MR_ENDPOINT;  // honoured: registrations are bound to the endpoint
    FC_CHECK(unusable(f.info).empty() && caps_of(f.info).mr_endpoint, "FI_MR_ENDPOINT");
  }
}

void test_write_size_cap() {
  FakeInfo f = efa(false);
  f.ep.max_msg_size = 8 << 20;
  FC_CHECK(caps_of(f.info).max_write == (8u << 20), "writes in pieces of the provider's largest message");
  f.ep.max_msg_size = 0;
  FC_CHECK(caps_of(f.info).max_write == (uint64_t{1} << 30), "unknown: 1 GiB pieces");
}

void test_cq_data_layout() {
  for (size_t bytes : {size_t{4}, size_t{8}}) {
    const libfabric::wire::CqDataLayout l = libfabric::wire::CqDataLayout::for_bytes(bytes);
    FC_CHECK(l.stream_bits + 1 + l.seq_bits <= static_cast<int>(8 * bytes), "fits the CQ data");
    for (uint64_t next : {uint64_t{1}, l.seq_mask() - 3, l.seq_mask() + 5, uint64_t{3} * l.seq_mask()}) {
      for (uint64_t ahead : {uint64_t{0}, uint64_t{1}, l.window() - 1}) {
        const uint64_t seq = next + ahead;
        const uint64_t data = l.encode(l.max_stream(), ahead % 2 == 1, seq);
        FC_CHECK(l.stream_of(data) == l.max_stream(), "stream");
        FC_CHECK(l.has_signal(data) == (ahead % 2 == 1), "signal bit");
        FC_CHECK(l.seq_of(data, next) == seq,
                 "sequence " + std::to_string(seq) + " from " + std::to_string(next));
      }
    }
    FC_CHECK(l.window() <= (uint64_t{1} << (l.seq_bits - 2)), "window well inside the sequence space");
  }
}

}  // namespace

int main() {
  fctest::run_case("efa with FI_HMEM: CQ-data signals, FI_HMEM seen", test_efa_with_hmem);
  fctest::run_case("efa without FI_HMEM: host staging", test_efa_without_hmem_stages);
  fctest::run_case("verbs;ofi_rxm: FI_RX_CQ_DATA, host staging", test_verbs);
  fctest::run_case("remote CQ data absent or small: signals as messages", test_no_cq_data);
  fctest::run_case("providers refused: no RMA, no messages, one-way writes, modes not honoured",
                   test_refusals);
  fctest::run_case("writes in pieces of the provider's largest message", test_write_size_cap);
  fctest::run_case("remote CQ data: stream, signal bit and sequence round-trip", test_cq_data_layout);
  return fctest::finish();
}
